# Shared set-up: config validation, the installed library, the stage lists and the lookups every rule uses
# (splits, threads, resources, the conda env of a PyTorch job). A job's stage parameters:
# dpr_pipeline.orchestration.stage_settings (`settings`); input functions: rules/inputs.smk; the report's and the default
# target's file lists: rules/report_inputs.smk.
import os
import re
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.io import strip_wildcard_constraints
from snakemake.logging import logger as snakemake_logger

try:
    import dpr_pipeline
except ImportError:
    raise WorkflowError("the dpr_pipeline package is not installed in the environment Snakemake runs in, which its "
                        "jobs run in too. Fix: `make install` in this checkout (or `pip install -c constraints.txt "
                        "-e .` in your venv), then run snakemake from that environment")
# The jobs import the package installed in this environment: warn when it is another checkout's code
CHECKOUT_SRC = Path(workflow.basedir).resolve() / "src"
if not Path(dpr_pipeline.__file__).resolve().is_relative_to(CHECKOUT_SRC):
    snakemake_logger.warning(f"dpr_pipeline is imported from {Path(dpr_pipeline.__file__).parent}, not from this "
                             f"checkout ({CHECKOUT_SRC}): the jobs run that code. Fix: `make install` (or `pip install "
                             "-e .`) in this checkout, in the environment snakemake runs in")

from dpr_pipeline.orchestration.run_folders import working_directory_config

# After the bundled config (the Snakefile's `configfile:`), a config.yaml of the working directory that differs from
# it, as Snakemake reads a workflow's `configfile:` there; each --configfile still extends both
if WORKING_DIRECTORY_CONFIG := working_directory_config(workflow.basedir, os.getcwd()):
    snakemake_logger.info(f"Reading {WORKING_DIRECTORY_CONFIG} (the working directory's config.yaml) after the "
                          f"bundled {Path(workflow.basedir, 'config.yaml')}")
    workflow.configfile(str(WORKING_DIRECTORY_CONFIG))

import dpr_pipeline.orchestration.stage_settings as settings
import dpr_pipeline.stages as stages
from dpr_pipeline.orchestration.preflight import check_plan, check_shard_groups, planned_requests, retry_caps
from dpr_pipeline.orchestration.resources import (cluster_resources, failed_attempts, gpu_request, job_resources,
                                                  job_runtime, planned_trainings, scaled, training_request,
                                                  training_request_keys, training_retries)
from dpr_pipeline.orchestration.checkpoints import remove_finished_checkpoints
from dpr_pipeline.orchestration.cluster_facts import read_cluster_facts
from dpr_pipeline.orchestration.cluster_site import read_site, site_file, site_overrides
from dpr_pipeline.orchestration.config import train_split_of, validate_config
from dpr_pipeline.orchestration.deleted_inputs import rerun_deleted_inputs
from dpr_pipeline.orchestration.hub_models import check_offline_fetches
from dpr_pipeline.training.settings import DevSelectionSettings
from dpr_pipeline.training.stops import continuations, training_finished
from dpr_pipeline.training.tracking import check_installed, tracking_run
from dpr_pipeline.layout import (PRETRAINING_START, RESULTS, TEACHER_SCORES, benchmark_file, checkpoint_dir,
                                 data_file, dataset_file, denoise_pool_file, denoise_scores_file, denoise_shard_file,
                                 log_file, model_dir, negatives_filter_files, release_dir, stage_file)
from dpr_pipeline.data.dev_split import carve_of, source_split
import dpr_pipeline.orchestration.run_errors as run_errors


def result_folders():
    """The folders the rules write under results/{dataset}/ (a wildcard there, {stage} or {trained}: every
    stage's top folder)."""
    stage_folders = {stages.stage(stage).name for stage in STAGES + ABLATION_STAGES}
    folders = set()
    for declared in workflow.rules:
        for path in declared.output:
            parts = strip_wildcard_constraints(str(path)).split("/")
            if parts[:2] == [RESULTS, "{dataset}"] and len(parts) > 3:
                folders.update(stage_folders if parts[2].startswith("{") else [parts[2]])
    return folders


def explain_error(error):
    """The project's message for an error that stops Snakemake before any job runs (dpr_pipeline.orchestration.run_errors)."""
    datasets = config.get("datasets") if isinstance(config, dict) else None
    return run_errors.explain(error, datasets=datasets if isinstance(datasets, dict) else {},
                              folders=result_folders, configfiles=workflow.configfiles,
                              folders_of_run={"workdir": os.getcwd(), "rundir": workflow.rundir,
                                              "basedir": workflow.basedir})


def remove_finished_trainings():
    """Remove the checkpoint folders of the trainings whose jobs completed (orchestration/checkpoints.py), naming
    them in the log."""
    for folder in remove_finished_checkpoints(os.getcwd()):
        snakemake_logger.info(f"Removed the finished training's checkpoints {folder}")


def failed_jobs():
    """The jobs this run gave up on (after their retries), from Snakemake's scheduler."""
    jobs = getattr(getattr(workflow, "scheduler", None), "failed", ())
    return sorted((run_errors.FailedJob(job.rule.name, dict(job.wildcards.items()), tuple(map(str, job.log)))
                   for job in jobs), key=run_errors.FailedJob.name)


# The run ends with the project's message, not a traceback: the error Snakemake prints as it stops (in Snakemake
# 9.27 a log record carrying `exception`, after `onerror`: tests/test_snakemake_behaviour.py) is replaced by the
# failed jobs' messages (set by `onerror` in the Snakefile) or by explain_error's (docs/bad_inputs.md).
LAST_LINES = run_errors.LastLines.install(snakemake_logger, explain_error)

SCHEMA_FILE = Path(workflow.basedir, "schemas", "config.schema.yaml")
SCHEMA = yaml.safe_load(SCHEMA_FILE.read_text())
# The site file (site.yaml, or $DPR_PIPELINE_SITE's): the cluster block, checked as it is read, then merged by
# Snakemake's own configfile after the config.yaml files, so each --configfile and --config still extends it
# (dpr_pipeline.orchestration.cluster_site, docs/cluster.md)
if SITE_FILE := site_file():
    SITE = read_site(SITE_FILE, SCHEMA_FILE)
    if SITE["cluster"]:
        snakemake_logger.info(f"Reading the cluster block of {SITE_FILE} (the site file)")
        workflow.configfile(str(SITE_FILE))
    for key in site_overrides(SITE, workflow.config_settings.overwrite_config):
        snakemake_logger.warning(f"{key} of {SITE_FILE} is overridden by the command line (--configfile, --config)")
# the one validation route (the tests' too): defaults filled in, moved settings named, `config key …: … Fix: …`
# for the top-level blocks and a dataset's overrides alike, dataset names checked
validate_config(config, SCHEMA_FILE)
check_offline_fetches(config)
check_installed(config)  # a tracker `tracking.backends` names, installed (the `tracking` extra)

# The stage lists, from their declaration (src/dpr_pipeline/stages.py). The chain in pipeline order (SimLM
# Figure 2); each writes results/{dataset}/{stage}/run_{split}.trec.
STAGES = stages.chain()
# Pre-training methods (config pretrain.method), each pre-training an encoder under
# results/{dataset}/pretrain/{method}/; the ablation fine-tunes Retriever1 from each (and from `none`, the
# un-pre-trained plm) under results/{dataset}/ablation/{method}/, as SimLM's Table 7 does.
PRETRAIN_METHODS = SCHEMA["$defs"]["pretrain"]["properties"]["method"]["enum"]
PRETRAINED_STAGES = stages.members(stages.PRETRAINING, PRETRAIN_METHODS)
ABLATION_STAGES = stages.members(stages.ABLATION, ["none"] + PRETRAIN_METHODS)
# Stages with an encoder, a corpus index and dense runs; stages that re-rank another stage's runs.
BIENCODERS = stages.chain(stages.BIENCODER) + ABLATION_STAGES
CROSS_ENCODERS = stages.chain(stages.CROSS_ENCODER)
# What feeds the re-ranker: the stage whose runs it re-ranks (and fuses with) and whose mined negatives train it
# and its teacher scores.
RERANKED = stages.stage("reranker").fed_by


# The cluster's facts and the shard groups' sizes the plan was checked against (onstart, under a cluster executor): no
# retry grows past the largest node of its partition, nor past its partition's or QoS's time limit (preflight.py,
# retry_caps). None in a dry run, a local run and inside the cluster jobs, which submit nothing.
SUBMITTED_TO = {"facts": None, "group_sizes": {}}


def retry_caps_of(rule_name):
    """How far a retry of `rule_name`'s jobs may grow (`fetch`: the fetch jobs'), from SUBMITTED_TO."""
    return retry_caps(config, SUBMITTED_TO["facts"], rule_name, SUBMITTED_TO["group_sizes"])


# A training longer than the cluster's longest job (cluster.max_runtime) runs as several attempts, each continuing
# from the checkpoint the one before saved: the training rules get those continuations on top of --retries, which
# stay for failures (orchestration/resources.py, training_retries). Set as the run starts (onstart: not in a dry run, not
# in each cluster job), when --retries and the plan are known, as each rule's `restart_times` (Snakemake 9.27 reads
# it per job; a rule's `retries:` is fixed before the plan: tests/test_snakemake_behaviour.py).
# First, the finished checkpoint folders of trainings whose jobs completed go (as the run ends too: the Snakefile's
# onsuccess and onerror), so that a training Snakemake reruns does not resume one (orchestration/checkpoints.py).
# Under a cluster executor, the preflight then checks every job of the plan, at its first attempt and at the last its
# retries can make, against the cluster's limits (config cluster, sinfo, sacctmgr) and stops the run before its
# first submission when one cannot run (orchestration/preflight.py); the facts it read then bound how far each retry
# grows (SUBMITTED_TO, read by resources_of).
onstart:
    remove_finished_trainings()
    planned = planned_trainings(workflow.dag.needrun_jobs())
    for rule_name, retries in training_retries(config, workflow.execution_settings.retries, planned).items():
        workflow.get_rule(rule_name).restart_times = retries
    if not workflow.local_exec:
        group_sizes = dict(workflow.group_settings.group_components)
        check_shard_groups(group_sizes, dict(workflow.resource_settings.resources).get("shard_gpu"))
        facts = read_cluster_facts()
        check_plan(planned_requests(workflow.dag.needrun_jobs(), workflow._localrules, group_sizes,
                                    {rule.name: rule.restart_times for rule in workflow.rules}),
                   config, facts, jobs_at_once=workflow.resource_settings.nodes, group_sizes=group_sizes)
        SUBMITTED_TO.update(facts=facts, group_sizes=group_sizes)


# A shard job (stages.SHARD_GROUPS) also asks one `shard_gpu`, counted per group job (local scope): a cluster
# profile's `resources: shard_gpu=1` makes a group of shard jobs run one after the other on its one GPU
# (profiles/slurm/config.yaml). No other job asks for it, so the limit caps nothing else.
resource_scopes:
    shard_gpu="local",


wildcard_constraints:
    dataset="|".join(map(re.escape, config["datasets"])),
    split=r"[A-Za-z0-9._-]+",
    stage="|".join(STAGES + ABLATION_STAGES),
    method="|".join(PRETRAIN_METHODS),
    shard=r"\d+",


def dataset_config(wildcards):
    return config["datasets"][wildcards.dataset]


def train_split(wildcards):
    """The dataset's train split; an evaluation-only dataset (no train_split) fails with one message naming the
    dataset, the missing split and the job (rule and stage) that needs it."""
    job = " ".join(f"{key}={value}" for key, value in wildcards.items() if key != "dataset")
    return train_split_of(config, wildcards.dataset, f"the training job ({job})" if job else "training")


def eval_splits(wildcards):
    return dataset_config(wildcards)["eval_splits"]


def raw_split(wildcards):
    """The split whose raw files the job's {split} is read from: the train split for a carved dev split."""
    return source_split(dataset_config(wildcards), wildcards.split)


def split_files(wildcards):
    """The split's raw file names when the dataset's `split_files` renames them (msmarco), else None."""
    return dataset_config(wildcards).get("split_files", {}).get(raw_split(wildcards))


def threads_of(rule_name):
    """A rule's CPU threads: config `resources` (per dataset overrides), see src/dpr_pipeline/orchestration/resources.py."""
    return lambda wildcards: job_resources(config, wildcards.dataset, rule_name)["threads"]


def resources_of(rule_name):
    """A rule's portable resources (docs/cluster.md): mem_mb and runtime (minutes) from config `resources`, times
    the failed attempts so far on a retry, up to what the cluster allows (retry_caps_of; runtime at most
    cluster.max_runtime; a training's attempt that stopped at its time limit is no failure, nor one stopped after
    its training finished); GPUs (`gpu` or `gres`, config cluster.gpu_request): the stage's `processes` for a
    trainer (torchrun starts one process per GPU) over its `nodes` (training_request: per node, with the Slurm
    plugin's task resources), 1 for the other GPU rules, none for CPU rules; nodes: 1 for the other GPU rules;
    partition, account, QoS and constraint from config cluster."""
    first = lambda wildcards: job_resources(config, wildcards.dataset, rule_name)
    failed = lambda wildcards, attempt: attempt  # every earlier attempt of a job failed, but for a training's:
    if rule_name in stages.GPU_TRAINING_RULES:   # one stopped at its time limit continues at the same size, one
        folder = lambda wildcards: checkpoint_dir(     # after its training finished asks the first attempt's
            stages.trained_stage(rule_name, dict(wildcards.items())), wildcards.dataset)
        failed = lambda wildcards, attempt: failed_attempts(attempt, continuations(folder(wildcards)),
                                                            training_finished(folder(wildcards)))
    resources = {
        "mem_mb": lambda wildcards, attempt: scaled(first(wildcards)["mem_mb"], failed(wildcards, attempt),
                                                   retry_caps_of(rule_name).mem_mb),
        "runtime": lambda wildcards, attempt: job_runtime(config, first(wildcards)["runtime"],
                                                          failed(wildcards, attempt),
                                                          retry_caps_of(rule_name).runtime),
        **cluster_resources(config, rule_name in stages.GPU_RULES),
    }
    if rule_name in stages.GPU_TRAINING_RULES:
        block = stages.GPU_TRAINING_RULES[rule_name]
        request = lambda wildcards: training_request(config,
                                                     settings.training_processes(config, wildcards.dataset, block),
                                                     settings.training_nodes(config, wildcards.dataset, block))
        resources.update({key: (lambda wildcards, key=key: request(wildcards).get(key))
                          for key in training_request_keys(config)})
    elif rule_name in stages.GPU_INFERENCE_RULES:
        resources.update(gpu_request(config, 1), nodes=1)
        if rule_name in stages.SHARD_GROUPS:
            resources["shard_gpu"] = 1
    else:
        resources["gpu"] = 0
    return resources


def torch_env(rule_name):
    """The conda env, relative to rules/, of a PyTorch job: envs/torch-gpu.yaml where resources_of gives the
    rule GPUs, else envs/torch.yaml (src/dpr_pipeline/stages.py)."""
    return f"../{stages.torch_env(rule_name)}"


def ablation_methods(wildcards):
    return settings.pretrain(config, wildcards.dataset)["ablation_methods"]


# Answer-based relevance (format dpr, `relevance: answers`): a passage is relevant when it contains an answer.
ANSWER_METRICS = ["R@5", "R@20", "R@100"]  # top-k retrieval accuracy, SimLM Table 4 (NQ)


def relevance_of(wildcards):
    """How the evaluated dataset judges a hit (evaluated_dataset: the transfer target in transfer_evaluate)."""
    return evaluated_dataset(wildcards).get("relevance", "qrels")


def dataset_metrics(wildcards):
    """The evaluated dataset's `metrics`, else evaluation.metrics (qrels) or R@5/R@20/R@100 (answers)."""
    if "metrics" in evaluated_dataset(wildcards):
        return evaluated_dataset(wildcards)["metrics"]
    return ANSWER_METRICS if relevance_of(wildcards) == "answers" else config["evaluation"]["metrics"]
