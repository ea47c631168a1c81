"""The preflight before a cluster run (`make cluster-check TARGET=...`): every job the target's plan would submit
checked against the config's `cluster` block (the site file's, site.yaml, as the run reads it) and what the
cluster says (sinfo, sacctmgr, scontrol), without submitting anything. Prints one line per refusal, each naming the
rule, what it asks, what the cluster allows and the setting that fixes it (a cluster key: in the site file), and
exits 1; or says how many jobs it checked, against what, and exits 0.

    .venv/bin/python scripts/cluster_check.py results/msmarco/distill/metrics.json   # --configfile as the run's

checks the shard groups and retries of profiles/slurm, or of `--profile <your copy>`, or `--group-components` and
`--retries` as given to snakemake; each job at its first attempt and at the last its retries can make.

Off the cluster (no sinfo), only the config's own limits (cluster.gpus_per_node) are checked, and it says so.
A `--profile slurm` run does the same check before its first sbatch (rules/common.smk, onstart).
"""
import argparse
import sys
from pathlib import Path

import yaml
from dag_plan import REPO, built_dag

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.cluster_facts import read_cluster_facts
from dpr_pipeline.orchestration.preflight import check_plan, planned_requests
from dpr_pipeline.orchestration.resources import planned_trainings, training_retries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="files or rules (none: the default target)")
    parser.add_argument("--configfile", action="append", default=[], help="as snakemake's, repeatable")
    parser.add_argument("--forceall", action="store_true", help="check every job, also those already done")
    parser.add_argument("--jobs", type=int, help="jobs queued at once (default: the profile's `jobs:`)")
    parser.add_argument("--profile", type=Path, default=REPO / "profiles" / "slurm",
                        help="the profile folder the run will use (default: profiles/slurm)")
    parser.add_argument("--group-components", nargs="+", default=None, metavar="GROUP=SIZE",
                        help="as snakemake's: replaces the profile's group-components")
    parser.add_argument("--retries", type=int, help="as snakemake's (default: the profile's `retries:`)")
    args = parser.parse_args(argv)
    profile = yaml.safe_load((args.profile / "config.yaml").read_text())
    groups = profile.get("group-components", []) if args.group_components is None else args.group_components
    group_sizes = {name: int(size) for name, size in (item.rsplit("=", 1) for item in groups)}
    retries = profile.get("retries", 0) if args.retries is None else args.retries
    try:
        with built_dag(args.targets, args.configfile, forceall=args.forceall) as workflow:
            config, needrun = workflow.config, list(workflow.dag.needrun_jobs())
            rule_retries = {**{rule.name: retries for rule in workflow.rules},       # as rules/common.smk's onstart
                            **training_retries(config, retries, planned_trainings(needrun))}
            jobs = planned_requests(needrun, workflow._localrules, group_sizes, rule_retries)
    except ConfigError as error:
        print(f"cluster check: the config: {error}", file=sys.stderr)
        return 1
    facts = read_cluster_facts()
    against = (f"partitions {', '.join(sorted(facts.partitions))} (sinfo)" if facts is not None else
               "the config's cluster block only (no sinfo here: partitions, time limits and nodes unchecked)")
    try:
        jobs_at_once = args.jobs or profile["jobs"]
        check_plan(jobs, config, facts, jobs_at_once, group_sizes)
    except ConfigError as error:
        print(f"cluster check: {len(jobs)} jobs against {against}: {error}", file=sys.stderr)
        return 1
    print(f"cluster check: {len(jobs)} jobs (shard jobs in their groups) against {against}: every job "
          "can run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
