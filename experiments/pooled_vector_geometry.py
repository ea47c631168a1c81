"""How spread out the pooled vectors of a pre-trained encoder are, before any label is seen: the mean pairwise
cosine (± its sd) of the unit vectors of the corpus's first passages, per model folder (docs/pretraining.md,
"The ablation on the bundled SciFact": what each method hands Retriever₁). Near 1: one vector for every passage,
which Retriever₁ must first learn to spread; a large sd: tight clusters.

    .venv/bin/python experiments/pooled_vector_geometry.py --pooling cls \\
        --corpus results/scifact_pretrain_cpu/data/corpus.parquet \\
        results/scifact_pretrain_cpu/pretrain_start/model results/scifact_pretrain_cpu/pretrain/*/model

--pooling cls reads the last layer's [CLS] state, mean the mean over the real tokens (sentence-transformers'
mean pooling), whatever pooling a folder records.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.models.embedding import POOLING_MODES, pool
from dpr_pipeline.models.loading import load_encoder, load_tokenizer


@torch.no_grad()
def pooled_vectors(folder: Path, texts: list[str], pooling: str, max_length: int) -> torch.Tensor:
    """Unit vectors of ``texts`` from the encoder in ``folder``, pooled as the retrievers pool (``pool``)."""
    tokenizer = load_tokenizer(str(folder))
    encoder = load_encoder(str(folder)).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    vectors = pool(encoder(**batch).last_hidden_state, batch["attention_mask"], pooling)
    return torch.nn.functional.normalize(vectors, dim=-1)


def pairwise_cosine(vectors: torch.Tensor) -> tuple[float, float]:
    """Mean and sd of the cosine over every pair of distinct rows of unit ``vectors``."""
    cosines = vectors @ vectors.T
    pairs = cosines[torch.triu(torch.ones_like(cosines, dtype=torch.bool), diagonal=1)]
    return pairs.mean().item(), pairs.std().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="model folders (encoder + tokenizer)")
    parser.add_argument("--corpus", type=Path, required=True, help="an ingested corpus.parquet")
    parser.add_argument("--pooling", choices=POOLING_MODES, required=True)
    parser.add_argument("--passages", type=int, default=200, help="the corpus's first N passages")
    parser.add_argument("--max-length", type=int, default=256)
    args = parser.parse_args()
    corpus = pd.read_parquet(args.corpus, columns=["title", "text"]).head(args.passages)
    texts = [passage_text(title, text) for title, text in zip(corpus["title"], corpus["text"])]
    print(f"| model | mean pairwise cosine of the unit {args.pooling} vectors ({len(texts)} passages) | sd |")
    print("| --- | ---: | ---: |")
    for folder in args.folders:
        mean, sd = pairwise_cosine(pooled_vectors(folder, texts, args.pooling, args.max_length))
        print(f"| {folder} | {mean:.3f} | {sd:.3f} |")


if __name__ == "__main__":
    main()
