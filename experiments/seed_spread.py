"""Rerun one trained stage with other seeds on a finished run's inputs and report mean ± sd per split (the dev
split first), with its margin over the stage below it (dpr_pipeline.evaluation.seed_spread says how):

    .venv/bin/snakemake                                                  # the finished run (seed 42)
    .venv/bin/python experiments/seed_spread.py distill --seeds 1 2      # + seeds 1 and 2 of the distilled retriever

writes results/<dataset>/seed_spread_<stage>.{json,md}. The finished run counts as its configured seed; each other
seed costs one run of the stage (training, corpus encoding, search, evaluation: about 7 minutes for the bundled
distilled retriever on 2 CPU cores).

A mining variant reruns the stage on negatives mined with other settings (`mining.<the stage it is fed by>`), on
every seed given and the configured one, and reports its paired difference from the runs without it (the finished
run and the seeds this script ran before without `--mining`):

    .venv/bin/python experiments/seed_spread.py retriever2 --seeds 1 2 --mining relative_margin=0.05

writes results/<dataset>/seed_spread_<stage>_mining_<settings>.{json,md}. A variant of the stage's own settings
(keys of its config block) is run and read the same way:

    .venv/bin/python experiments/seed_spread.py distill --seeds 1 2 --set negatives_per_query=15

writes results/<dataset>/seed_spread_<stage>_set_<settings>.{json,md}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from dpr_pipeline.stages import STAGE_BELOW
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.evaluation.seed_spread import (SEEDED_STAGES, rerun, seed_workdir, seeded_config, variant_name,
                                                 write_report)
from dpr_pipeline.evaluation.summary import read_metrics
from dpr_pipeline.orchestration.config import load_config, stage_params, validate_config
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
    parser.add_argument("--mining", nargs="+", default=[], metavar="KEY=VALUE",
                        help="a mining variant: settings of mining.<the stage it trains on the negatives of>")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a variant of the stage's own settings: keys of its config block")
    args = parser.parse_args()
    mining, settings = (parsed_settings(parser, given) for given in (args.mining, args.settings))
    variant = variant_name(mining, settings)

    raw = load_config(args.configfile)  # validated: the seeds' configs are this one with one seed changed
    as_written = yaml.safe_load(args.configfile.read_text(encoding="utf-8"))
    try:  # and the variant's: a key its block lacks fails here, before any rerun folder is made
        validate_config(seeded_config(as_written, args.dataset, args.stage, 0, mining, settings))
    except ConfigError as error:
        parser.error(f"--mining/--set: {error}")
    configured = stage_params(raw, args.dataset, SEEDED_STAGES[args.stage])["seed"]
    metrics = stage_file(args.stage, "metrics.json", args.dataset)
    finished = {configured: read_metrics(args.workdir / metrics)}
    runs = {} if variant else dict(finished)
    for seed in dict.fromkeys([configured, *args.seeds] if variant else args.seeds):
        if seed in runs:
            continue
        rerun_dir = seed_workdir(args.workdir, as_written, args.dataset, args.stage, seed, mining, settings)
        done = rerun_dir / metrics  # a finished rerun is read again (delete its folder to rerun it)
        runs[seed] = read_metrics(done if done.is_file() else rerun(REPO, rerun_dir, args.dataset, args.stage,
                                                                     args.cores))
    baseline = None
    if variant:  # the runs without the variant: the finished one and the seeds rerun before without a variant
        seeds_dir = args.workdir / dataset_file("seeds", args.dataset) / args.stage
        baseline = finished | {seed: read_metrics(seeds_dir / f"seed_{seed}" / metrics) for seed in runs
                               if (seeds_dir / f"seed_{seed}" / metrics).is_file()}
    below = STAGE_BELOW[args.stage]
    lower = read_metrics(args.workdir / stage_file(below, "metrics.json", args.dataset))
    name = f"seed_spread_{args.stage}" + (f"_{variant}" if variant else "")
    stem = args.workdir / dataset_file(name, args.dataset)
    write_report(Path(stem), args.stage, below, runs, lower, variant, baseline)
    print(Path(f"{stem}.md").read_text(encoding="utf-8"))


def parsed_settings(parser: argparse.ArgumentParser, given: list[str]) -> dict:
    """``KEY=VALUE`` arguments as ``{key: value}``, each value read as YAML (``15``, ``0.1``, ``all``)."""
    malformed = [setting for setting in given if "=" not in setting]
    if malformed:
        parser.error(f"{malformed[0]!r}: give a setting as KEY=VALUE")
    return {key: yaml.safe_load(value) for key, value in (setting.split("=", 1) for setting in given)}


if __name__ == "__main__":
    main()
