"""SimLM's Table 7 over seeds: each row of a finished pre-training ablation (pre-training + Retriever₁) rerun
with other seeds on the same inputs; each method's mean ± sd per split and its difference from `none` and from
`mlm`, seed by seed (dpr_pipeline.evaluation.seed_spread says how a rerun's folder is made):

    .venv/bin/snakemake results/scifact/ablation/summary.json              # the finished ablation (seed 42)
    .venv/bin/python experiments/ablation_seeds.py --seeds 1 2             # + seeds 1 and 2 of each of its rows

writes results/<dataset>/ablation/seeds.{json,md}. A seed sets both `pretrain.seed` and `retriever.seed`; the
finished rows count as their configured seed (the two must then be equal). Each other seed of a method costs
one pre-training and one Retriever₁ (bundled SciFact: about 6 + 6 minutes on 2 CPU cores; `none`: Retriever₁).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from dpr_pipeline.evaluation.seed_spread import rerun, seed_workdir, write_ablation_report
from dpr_pipeline.evaluation.summary import read_metrics
from dpr_pipeline.orchestration.config import load_config, stage_params
from dpr_pipeline.layout import stage_file
from dpr_pipeline.stages import ABLATION, PRETRAINING, member

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="seeds besides the configured one")
    parser.add_argument("--methods", nargs="+", help="rows to rerun (default: pretrain.ablation_methods)")
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--configfile", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO,
                        help="the finished run's working directory (its results/ and data/; default: this checkout)")
    args = parser.parse_args()

    raw = load_config(args.configfile)  # validated: the seeds' configs are this one with the seeds changed
    as_written = yaml.safe_load(args.configfile.read_text(encoding="utf-8"))
    methods = args.methods or stage_params(raw, args.dataset, PRETRAINING.block)["ablation_methods"]
    configured = {stage_params(raw, args.dataset, block)["seed"] for block in (PRETRAINING.block, ABLATION.block)}
    if len(configured) != 1:
        sys.exit(f"pretrain.seed and retriever.seed differ ({sorted(configured)}): set them equal, so the "
                 "finished ablation is one seed's row")
    (seed,) = configured
    stem = args.workdir / stage_file(ABLATION.name, "seeds", args.dataset)
    runs = {}
    for method in methods:  # the report is rewritten after each row: a stopped run keeps the rows it finished
        stage = member(ABLATION, method)
        runs[method] = {seed: read_metrics(args.workdir / stage_file(stage, "metrics.json", args.dataset))}
        for other in args.seeds:
            if other != seed:
                rerun_dir = seed_workdir(args.workdir, as_written, args.dataset, stage, other)
                runs[method][other] = read_metrics(rerun(REPO, rerun_dir, args.dataset, stage, args.cores))
        write_ablation_report(stem, runs)
    print(stem.with_suffix(".md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
