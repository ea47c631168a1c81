"""Rerun one trained stage with other seeds on a finished run's inputs and report mean ± sd per split (the dev
split first), with its margin over the stage below it (dpr_pipeline.evaluation.seed_spread says how):

    .venv/bin/snakemake                                                  # the finished run (seed 42)
    .venv/bin/python experiments/seed_spread.py distill --seeds 1 2      # + seeds 1 and 2 of the distilled retriever

writes results/<dataset>/seed_spread_<stage>.{json,md}. The finished run counts as its configured seed; each other
seed costs one run of the stage (training, corpus encoding, search, evaluation: about 7 minutes for the bundled
distilled retriever on 2 CPU cores).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from dpr_pipeline.stages import STAGE_BELOW
from dpr_pipeline.evaluation.seed_spread import SEEDED_STAGES, rerun, seed_workdir, write_report
from dpr_pipeline.evaluation.summary import read_metrics
from dpr_pipeline.orchestration.config import load_config, stage_params
from dpr_pipeline.layout import dataset_file, stage_file

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(SEEDED_STAGES))
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="seeds besides the configured one")
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--configfile", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO,
                        help="the finished run's working directory (its results/ and data/; default: this checkout)")
    args = parser.parse_args()

    raw = load_config(args.configfile)  # validated: the seeds' configs are this one with one seed changed
    as_written = yaml.safe_load(args.configfile.read_text(encoding="utf-8"))
    configured = stage_params(raw, args.dataset, SEEDED_STAGES[args.stage])["seed"]
    runs = {configured: read_metrics(args.workdir / stage_file(args.stage, "metrics.json", args.dataset))}
    for seed in args.seeds:
        if seed == configured:
            continue
        rerun_dir = seed_workdir(args.workdir, as_written, args.dataset, args.stage, seed)
        runs[seed] = read_metrics(rerun(REPO, rerun_dir, args.dataset, args.stage, args.cores))
    below = STAGE_BELOW[args.stage]
    lower = read_metrics(args.workdir / stage_file(below, "metrics.json", args.dataset))
    stem = args.workdir / dataset_file(f"seed_spread_{args.stage}", args.dataset)
    write_report(Path(stem), args.stage, below, runs, lower)
    print(Path(stem).with_suffix(".md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
