"""Fine-tuning throughput: Retriever₁'s training step (Eq. 3, in-batch + hard negatives) in tokens/s and MFU.

The step is the pipeline's own: ``training.biencoder.BiEncoder`` over an ``embedding.TextEncoder`` ([CLS]
pooling), ``contrastive_step`` (Eq. 3 in float32, autocast off for the similarities), then the trainer's
optimizer step (backward, gradient clipping at 1.0, AdamW: fused on CUDA) under the trainer's bf16 autocast.
Shapes default to SimLM's Table 13 for MS MARCO: 64 queries × (1 positive + 15 hard negatives) passages of 144
tokens, queries of 32 tokens, BERT-base (random weights from ``BertConfig()``: the speed does not depend on the
values). Token ids are random and every sequence is full length (no padding): the step's FLOPs are fixed.
``--micro-batch-size M`` runs the step as the trainer does with a bi-encoder's ``micro_batch_size``: the gradient
cache (``training.grad_cache.cached_step``) over chunks of M queries and their passages; on CUDA the report gives
the step's peak allocated memory, so the one pass and the cached step compare (run it once each).

tokens/s counts query and passage tokens; MFU is the FLOPs of one step counted by ``torch.utils.flop_counter``
(forward and backward matrix products) over the median step time and ``--peak-tflops`` (the same method as
``pretrain_throughput.py``). On a CPU shrink the shapes (``--queries``, ``--group``, ``--layers`` …); the MFU
of a CPU is not reported (no single peak figure).

    .venv/bin/python benchmarks/finetune_throughput.py --device cuda --bf16          # Table 13 shapes
    .venv/bin/python benchmarks/finetune_throughput.py --device cpu --queries 4 --group 4 --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from dpr_pipeline.models import devices
from dpr_pipeline.models.embedding import TextEncoder
from dpr_pipeline.training.biencoder import BiEncoder, contrastive_step
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.grad_cache import cached_step
from dpr_pipeline.training.trainer import _optimizer_step
from dpr_pipeline.training.step_counts import count_ops_and_syncs
from timing import timed  # beside this script


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cpu, cuda … (default: the GPU when there is one)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (where the device runs it natively)")
    parser.add_argument("--queries", type=int, default=64, help="queries per step (Table 13: 64)")
    parser.add_argument("--group", type=int, default=16, help="passages per query, positive first (1 + 15)")
    parser.add_argument("--passage-length", type=int, default=144)
    parser.add_argument("--query-length", type=int, default=32)
    parser.add_argument("--layers", type=int, default=12, help="BERT-base: 12")
    parser.add_argument("--hidden", type=int, default=768, help="BERT-base: 768 (heads: hidden / 64)")
    parser.add_argument("--temperature", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after one warm-up step")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--micro-batch-size", type=int, default=0,
                        help="queries per chunk of the gradient cache (0: the whole batch in one pass)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="GPU peak dense bf16 (H100/H200: 989)")
    parser.add_argument("--output", type=Path)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device(args.device) if args.device else devices.default_device()
    config = BertConfig(num_hidden_layers=args.layers, hidden_size=args.hidden,
                        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                        attention_probs_dropout_prob=0.0)  # the pipeline trains without attention dropout
    torch.manual_seed(0)
    model = BiEncoder(TextEncoder(BertModel(config, add_pooling_layer=False), "cls")).to(device).train()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    passages = args.queries * args.group
    g = torch.Generator().manual_seed(0)
    batch = {"query_input_ids": torch.randint(1000, config.vocab_size, (args.queries, args.query_length), generator=g),
             "query_attention_mask": torch.ones(args.queries, args.query_length, dtype=torch.long),
             "passage_input_ids": torch.randint(1000, config.vocab_size, (passages, args.passage_length), generator=g),
             "passage_attention_mask": torch.ones(passages, args.passage_length, dtype=torch.long),
             "passage_keys": torch.arange(passages)}
    batch = devices.to_device(batch, device)
    tokens = args.queries * args.query_length + passages * args.passage_length
    compute_loss = contrastive_step(args.temperature)
    amp = devices.autocast(device, args.bf16)

    chunk = args.micro_batch_size
    if chunk and chunk < args.queries:
        chunks = [{key: (value[q:q + chunk] if key.startswith("query") else
                         value[q * args.group:(q + chunk) * args.group]) for key, value in batch.items()}
                  for q in range(0, args.queries, chunk)]

    def step():
        if chunk and chunk < args.queries:
            loss = cached_step(model, chunks, compute_loss, Distributed(), device, amp)
        else:
            with amp:
                loss = compute_loss(model, batch, Distributed())
        _optimizer_step(loss, model, optimizer, scheduler, 1.0)

    with FlopCounterMode(display=False) as flops:
        step()  # also the warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = [timed(step, device) for _ in range(args.steps)]
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    median = statistics.median(seconds)
    op_counts = count_ops_and_syncs(step, device)
    result = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else None, "bf16": devices.uses_bf16(device, args.bf16), "torch_threads": torch.get_num_threads(),
              "queries": args.queries, "group": args.group, "passage_length": args.passage_length,
              "query_length": args.query_length, "layers": args.layers, "hidden": args.hidden,
              "micro_batch_size": chunk, "peak_allocated_gib": peak,
              "tokens_per_step": tokens, "step_s": seconds, "tokens_per_s": tokens / median,
              "step_tflop": flops.get_total_flops() / 1e12, "op_counts": op_counts}
    if device.type == "cuda":
        result["mfu"] = result["step_tflop"] / median / args.peak_tflops
    print(f"{tokens} tokens/step  {result['tokens_per_s']:.0f} tokens/s  median step {median:.3f} s  "
          f"{result['step_tflop']:.3f} TFLOP/step" + (f"  MFU {result['mfu']:.1%}" if "mfu" in result else "")
          + f"  ops/syncs {op_counts['ops']}/{op_counts['syncs']}"
          + (f"  peak {peak:.1f} GiB" if peak is not None else ""), flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
