"""Print the jobs Snakemake would run for TARGETS as JSON, one object per job: rule, wildcards, inputs, outputs,
params, log, benchmark, resources (threads, mem_mb, runtime, gpu), conda env. For checking that a refactoring
leaves a plan unchanged:

    .venv/bin/python scripts/dag_plan.py results/msmarco/distill/metrics.json > before.json
    (change the code)
    .venv/bin/python scripts/dag_plan.py results/msmarco/distill/metrics.json > after.json && diff before.json after.json

Every job is planned (``--forceall``), whatever exists under results/. ``--configfile`` as in snakemake.

``--rules`` prints each rule of the parsed workflow instead (no DAG): the GPUs it asks for (a number, or
"per job" where a function of the job's wildcards sets them), its partition (config cluster) and its conda env;
tests/test_stages.py checks them against the stages' declaration.
"""
import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.settings.types import (
    ConfigSettings,
    DAGSettings,
    DeploymentSettings,
    OutputSettings,
    ResourceSettings,
    StorageSettings,
    WorkflowSettings,
)

REPO = Path(__file__).resolve().parents[1]
PLAN_RESOURCES = ("_cores", "threads", "mem_mb", "runtime", "gpu")


def _plain(value):
    """JSON-able form of a Snakemake value (Namedlists, paths, sets)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _named(namedlist) -> dict:
    """A Namedlist as {name: value} where it has names, else the list."""
    names = dict(namedlist.items())
    return _plain(names) if names else _plain(list(namedlist))


def job_plan(job) -> dict:
    resources = dict(job.resources.items())
    return {"rule": job.rule.name, "wildcards": _plain(dict(job.wildcards_dict)),
            "input": sorted(map(str, job.input)), "output": sorted(map(str, job.output)),
            "params": _named(job.params), "log": _plain(list(job.log)), "benchmark": _plain(job.benchmark),
            "resources": {k: _plain(resources[k]) for k in PLAN_RESOURCES if k in resources},
            "conda_env": _plain(job.rule.conda_env)}


@contextmanager
def parsed_workflow(configfiles: list[str]):
    """Snakemake's API object of this checkout's workflow with ``configfiles``, run from the repository root."""
    os.chdir(REPO)
    with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
        yield api.workflow(
            resource_settings=ResourceSettings(cores=256),
            config_settings=ConfigSettings(configfiles=[Path(f).resolve() for f in configfiles]),
            storage_settings=StorageSettings(), workflow_settings=WorkflowSettings(),
            deployment_settings=DeploymentSettings(), snakefile=REPO / "Snakefile", workdir=REPO)


def rule_declarations(configfiles: list[str]) -> dict[str, dict]:
    """``{rule: {"gpu": n or "per job", "conda_env": env}}`` of every rule as parsed (no DAG is built)."""
    with parsed_workflow(configfiles) as workflow_api:
        rules = workflow_api._workflow.rules
        declared = {}
        for rule in rules:
            values = {}
            for name in ("gpu", "slurm_partition"):
                value = rule.resources.get(name)
                value = getattr(value, "_value", value)  # a Resource holds the declared value, or a function
                values[name] = "per job" if callable(value) else value
            declared[rule.name] = {**values, "conda_env": _plain(rule.conda_env)}
    return declared


@contextmanager
def built_dag(targets: list[str], configfiles: list[str], forceall: bool = True):
    """The parsed workflow with its DAG for ``targets`` built (every job with ``forceall``, else those to run)."""
    with parsed_workflow(configfiles) as workflow_api:
        dag_api = workflow_api.dag(DAGSettings(targets=set(targets), forceall=forceall))
        workflow = dag_api.workflow_api._workflow
        workflow.dag_settings = dag_api.dag_settings
        workflow._prepare_dag(forceall=forceall, ignore_incomplete=True, lock_warn_only=True)
        workflow._build_dag()
        yield workflow


def plan(targets: list[str], configfiles: list[str]) -> list[dict]:
    with built_dag(targets, configfiles) as workflow:
        jobs = [job_plan(job) for job in workflow.dag.jobs]
    return sorted(jobs, key=lambda j: (j["rule"], json.dumps(j["wildcards"], sort_keys=True), j["output"]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="files or rules (none: the default target)")
    parser.add_argument("--configfile", action="append", default=[], help="as snakemake's, repeatable")
    parser.add_argument("--rules", action="store_true", help="each rule's GPUs and conda env instead of a plan")
    args = parser.parse_args(argv)
    if args.rules:
        json.dump(rule_declarations(args.configfile), sys.stdout, indent=1, sort_keys=True)
    else:
        json.dump(plan(args.targets, args.configfile), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
