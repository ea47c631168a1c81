"""Teacher scoring of every mined pair against only the pairs the distilled retriever draws, side by side.

Needs a finished bundled run (``make example``): its re-ranker, Retriever2's negatives, the passage store and the
train queries. Both variants score the same shard of the negatives (``--shard`` of ``--shards``, so a run takes
minutes) with the bundled settings, alternating which goes first, ``--repeats`` times each; reported: pairs
scored, seconds (median), the ratio of the medians, and whether the drawn pairs' scores equal the every-pair
scores (bf16 batches of other lengths move the last digits: the largest difference is printed).

    .venv/bin/python benchmarks/teacher_pairs.py --output benchmarks/runs/teacher_pairs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.reranking.teacher_scores import score_teacher_shard
from dpr_pipeline.orchestration import stage_settings
from dpr_pipeline.orchestration.config import load_config
from dpr_pipeline.layout import data_file, stage_file
from dpr_pipeline.stages import stage

REPO = Path(__file__).resolve().parents[1]


def flat_scores(path: Path) -> np.ndarray:
    frame = read_artifact(path, "negatives")
    return np.array([s for p, n in zip(frame["positive_scores"], frame["negative_scores"]) for s in (*p, *n)],
                    dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO,
                        help="the finished run's working directory (its results/; default: this checkout)")
    parser.add_argument("--configfile", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    config = load_config(args.configfile)
    params = stage_settings.reranker(config, args.dataset)
    draws = stage_settings.teacher_draws(config, args.dataset)
    if draws is None:
        sys.exit(f"{args.dataset}: stages.reranker.teacher_pairs is all; the comparison needs drawn")
    inputs = [args.workdir / stage_file("reranker", "model", args.dataset),
              args.workdir / stage_file(stage("reranker").fed_by, "negatives.parquet", args.dataset),
              args.workdir / data_file("passages.arrow", args.dataset),
              args.workdir / data_file("queries_train.parquet", args.dataset)]
    seconds = {"all": [], "drawn": []}
    with tempfile.TemporaryDirectory() as tmp:
        outputs = {name: Path(tmp) / f"{name}.parquet" for name in seconds}
        for repeat in range(args.repeats):
            for name in (("all", "drawn") if repeat % 2 == 0 else ("drawn", "all")):
                began = time.perf_counter()
                score_teacher_shard(*inputs, outputs[name], shard=args.shard, num_shards=args.shards,
                                    max_length=params["max_length"], batch_size=params["score_batch_size"],
                                    bf16=params["bf16"], draws=draws if name == "drawn" else None)
                seconds[name].append(time.perf_counter() - began)
        every, drawn = flat_scores(outputs["all"]), flat_scores(outputs["drawn"])
    scored = np.isfinite(drawn)
    result = {"shard": f"{args.shard} of {args.shards}", "pairs": {"all": int(len(every)), "drawn": int(scored.sum())},
              "seconds": seconds, "median_seconds": {k: statistics.median(v) for k, v in seconds.items()},
              "ratio_drawn_to_all": statistics.median(seconds["drawn"]) / statistics.median(seconds["all"]),
              "max_abs_diff_on_drawn": float(np.abs(drawn[scored] - every[scored]).max()) if scored.any() else 0.0,
              "draws": draws}
    print(json.dumps(result, indent=2))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
