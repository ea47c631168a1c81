"""The re-ranker's training step on one GPU: peak GPU memory and step time at the msmarco config's shapes.

The step is the pipeline's own: the trainer's micro-batch accumulation (``trainer._accumulate_gradients``) over a
process's share of the batch, Eq. 4 (``cross_encoder.listwise_batch_loss``) under the trainer's bf16 autocast,
then its clipped AdamW step (fused on CUDA). Model: ELECTRA-base's shapes (= BERT-base: 12 layers, 768 wide) as
a ``BertForSequenceClassification`` with one label and random weights (the memory and speed do not depend on the
values). Every pair is ``--max-length`` tokens (the worst case the memory must fit).

Defaults are the msmarco config: 8 GPUs share Table 13's 64 queries, so a GPU's share is 8 queries of
1 + 63 pairs of 192 tokens; ``--micro-batch-size`` queries per forward/backward (the config: 2).

    .venv/bin/python benchmarks/reranker_memory.py --device cuda --micro-batch-size 2 8
    .venv/bin/python benchmarks/reranker_memory.py --device cpu --queries 2 --group 4 --max-length 32 --layers 1
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

from dpr_pipeline.models import devices
from dpr_pipeline.training.cross_encoder import GROUP_SIZE, PairScorer, listwise_batch_loss
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.trainer import _accumulate_gradients, _optimizer_step
from timing import timed  # beside this script


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cpu, cuda … (default: the GPU when there is one)")
    parser.add_argument("--queries", type=int, default=8, help="one process's queries per step (64 / 8 GPUs)")
    parser.add_argument("--group", type=int, default=64, help="pairs per query, positive first (1 + 63)")
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--micro-batch-size", type=int, nargs="+", default=[2], help="queries per pass, each run")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false")
    parser.add_argument("--output", type=Path)
    return parser.parse_args()


def measure(args, device: torch.device, micro_batch_size: int) -> dict:
    config = BertConfig(num_hidden_layers=args.layers, hidden_size=args.hidden,
                        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                        num_labels=1)
    torch.manual_seed(0)
    model = PairScorer(BertForSequenceClassification(config).to(device).train())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    g = torch.Generator().manual_seed(0)
    examples = list(range(args.queries))
    ids = torch.randint(1000, config.vocab_size, (args.queries, args.group, args.max_length), generator=g)

    def collate(part: list[int]) -> dict:
        rows = ids[part].view(-1, args.max_length)
        return {"input_ids": rows, "attention_mask": torch.ones_like(rows),
                "token_type_ids": torch.zeros_like(rows), GROUP_SIZE: args.group}

    amp = devices.autocast(device, args.bf16)

    def step():
        parts = [examples[i:i + micro_batch_size] for i in range(0, len(examples), micro_batch_size)]
        loss = _accumulate_gradients(model, [collate(part) for part in parts], [len(part) for part in parts],
                                     listwise_batch_loss, device, amp, Distributed())
        _optimizer_step(loss, model, optimizer, scheduler, 1.0)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step()  # warm-up: the optimizer's states exist from here on
    seconds = [timed(step, device) for _ in range(args.steps)]
    result = {"micro_batch_size": micro_batch_size, "step_s": seconds,
              "pairs_per_s": args.queries * args.group / statistics.median(seconds)}
    if device.type == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    args = parse_args()
    device = torch.device(args.device) if args.device else devices.default_device()
    runs = []
    for micro_batch_size in args.micro_batch_size:
        runs.append(measure(args, device, micro_batch_size))
        r = runs[-1]
        print(f"micro-batch {micro_batch_size} queries ({micro_batch_size * args.group} pairs): median step "
              f"{statistics.median(r['step_s']):.3f} s, {r['pairs_per_s']:.0f} pairs/s"
              + (f", peak {r['peak_gib']:.1f} GiB allocated, {r['peak_reserved_gib']:.1f} GiB reserved"
                 if "peak_gib" in r else ""), flush=True)
    result = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else None, "bf16": devices.uses_bf16(device, args.bf16), "queries": args.queries,
              "group": args.group, "max_length": args.max_length, "layers": args.layers, "hidden": args.hidden,
              "runs": runs}
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
