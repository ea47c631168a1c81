"""Peak memory and step time of a bi-encoder step with the gradient cache (``micro_batch_size``) against the one pass.

Each run is a fresh process (so that its peak resident memory is its own): a random BERT, ``--queries`` queries ×
(1 + ``--negatives``) passages of random tokens, the contrastive loss (Eq. 3) forward and backward, one warm-up step
and ``--steps`` timed ones. The peak is the process's peak resident set (``ru_maxrss``) less its resident set before
the first step (model and inputs), i.e. what the step adds: activations, gradients, the cache. CPU only (the GPU's
allocator figures are ``reranker_memory.py``'s kind of measurement)::

    python benchmarks/grad_cache_memory.py --micro-batch-size 0 4
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
from transformers import BertConfig, BertModel

from dpr_pipeline.models.embedding import TextEncoder
from dpr_pipeline.training.biencoder import BiEncoder, BiEncoderLoss
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.grad_cache import cached_step


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--negatives", type=int, default=7, help="hard negatives per query")
    parser.add_argument("--query-length", type=int, default=32)
    parser.add_argument("--passage-length", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro-batch-size", type=int, nargs="+", default=[0, 4],
                        help="queries per chunk, one run each (0: the whole batch in one pass)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one setting in this process
    return parser.parse_args(argv)


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def measure(args, micro_batch_size: int) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=args.layers, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                        num_attention_heads=max(1, args.hidden // 64))
    model = BiEncoder(TextEncoder(BertModel(config, add_pooling_layer=False), "cls")).train()
    group = 1 + args.negatives
    g = torch.Generator().manual_seed(0)
    queries = torch.randint(1000, config.vocab_size, (args.queries, args.query_length), generator=g)
    passages = torch.randint(1000, config.vocab_size, (args.queries * group, args.passage_length), generator=g)

    def batch(rows: slice) -> dict:
        q, p = queries[rows], passages[rows.start * group:rows.stop * group]
        return {"query_input_ids": q, "query_attention_mask": torch.ones_like(q), "passage_input_ids": p,
                "passage_attention_mask": torch.ones_like(p),
                "passage_keys": torch.arange(rows.start * group, rows.stop * group)}

    loss_fn = BiEncoderLoss(0.02)
    chunk = micro_batch_size or args.queries
    parts = [batch(slice(i, i + chunk)) for i in range(0, args.queries, chunk)]
    whole = batch(slice(0, args.queries))

    def step() -> float:
        if micro_batch_size:
            loss = cached_step(model, parts, loss_fn, Distributed(), torch.device("cpu"))
        else:
            loss = loss_fn(model, whole, Distributed())
            loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss)

    before = rss_mb()
    losses = [step()]
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        losses.append(step())
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"micro_batch_size": micro_batch_size, "step_s": seconds, "median_step_s": statistics.median(seconds),
            "peak_added_mb": peak - before, "loss": losses[0]}


def main() -> None:
    args = parse_args()
    if args.one is not None:
        print(json.dumps(measure(args, args.one)))
        return
    runs = []
    for micro in args.micro_batch_size:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", str(micro)], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"micro_batch_size {micro or 'none (one pass)'}: median step {r['median_step_s']:.2f} s, peak added "
              f"{r['peak_added_mb']:.0f} MB, loss {r['loss']:.6f}", flush=True)
    base = runs[0]
    for r in runs[1:]:
        print(f"  {r['micro_batch_size']} against {base['micro_batch_size'] or 'one pass'}: memory "
              f"{r['peak_added_mb'] / base['peak_added_mb']:.2f}x, time {r['median_step_s'] / base['median_step_s']:.2f}x")


if __name__ == "__main__":
    main()
