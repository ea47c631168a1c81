"""Portable job resources of the workflow's rules: CPU threads, memory, runtime and GPUs.

Rules declare these (the Snakemake names ``threads``, ``mem_mb``, ``runtime`` in minutes, ``gpu``) and, from the
config's ``cluster`` block, the Slurm executor plugin's: partition, account, QoS, GPU constraint and model, and the
GPU request as ``--gpus`` or ``--gres`` (:func:`cluster_resources`, :func:`gpu_request`); the profile
(``profiles/slurm``) holds only how Snakemake submits.

* ``threads``, ``mem_mb``, ``runtime`` of a rule's first attempt come from the config's ``resources`` section
  (``resources.<rule>``, falling back to ``resources.default``), overridden per dataset under
  ``datasets.<name>.resources.<rule>`` (MS MARCO needs hours and tens of GB where the bundled SciFact needs
  minutes and one GB). A retry (``--retries``) multiplies memory and runtime by the attempt number, up to what the
  cluster allows (the largest node of the job's partition, its time limit and the QoS's ``MaxWall``, read as the run
  starts: :func:`dpr_pipeline.orchestration.preflight.retry_caps`); the runtime of every attempt is at most
  ``cluster.max_runtime`` (the partition's longest job) when that is set
  (:func:`job_runtime`): a training longer than that runs as several attempts, each resuming from the checkpoint
  the one before saved when its time limit's SIGTERM came (:mod:`dpr_pipeline.training.trainer`). Such a
  continuation is not a failure, nor is an attempt after the training has finished (one stopped while it wrote
  its other outputs): a training rule's memory and runtime scale with its failed attempts only
  (:func:`failed_attempts`), and it gets the continuations its longest job needs on top of ``--retries``
  (:func:`training_retries`, for the plan's jobs), so a real failure still has all its retries.
* ``nodes``: 1 for the GPU rules but a training over several nodes: Slurm never spreads a job's GPUs over nodes
  (``sbatch --nodes=1``) unless its stage asks ``nodes: N`` (:func:`training_request`).
* ``gpu``: GPU rules ask for GPUs, CPU rules for none; which rules are GPU rules follows from the stages'
  declaration (:mod:`dpr_pipeline.stages`: ``GPU_TRAINING_RULES``, ``GPU_INFERENCE_RULES``). Training rules ask
  for the stage's ``processes`` GPUs and launch one process per GPU (:func:`processes_for`): on one node
  ``torchrun --standalone``, over ``nodes`` N nodes ``processes / N`` GPUs on each (GRES, per node) and one
  torchrun per node (:mod:`dpr_pipeline.training.nodes`); encoding, search, re-ranking and teacher scoring ask for
  one GPU per job (more parallelism = more shards).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from dpr_pipeline import stages
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.config import stage_params

#: The first attempt's resources of a rule that ``resources`` does not name.
BUILTIN_DEFAULT = {"threads": 1, "mem_mb": 4000, "runtime": 60}


def job_resources(config: Mapping[str, Any], dataset: str, rule: str) -> dict[str, int]:
    """``threads``, ``mem_mb``, ``runtime`` (minutes) of ``rule``'s first attempt for ``dataset``: a training rule's
    ``gpu_minutes`` over its stage's ``processes`` where the most specific level that sets either sets that alone
    (a ``runtime`` beside them, as a ``--configfile`` overlay merges it in, wins)."""
    resources = config.get("resources") or {}
    per_dataset = config["datasets"][dataset].get("resources") or {}
    merged = dict(BUILTIN_DEFAULT)
    for level in (resources.get("default"), resources.get(rule), per_dataset.get("default"), per_dataset.get(rule)):
        if {"runtime", "gpu_minutes"} & set(level or ()):
            merged.pop("runtime", None), merged.pop("gpu_minutes", None)    # the more specific level's own
        merged.update(level or {})
        if "runtime" in (level or ()):
            merged.pop("gpu_minutes", None)
    if "gpu_minutes" in merged:
        if rule not in stages.GPU_TRAINING_RULES:
            raise ConfigError(f"resources.{rule}.gpu_minutes: only the training rules "
                              f"({', '.join(stages.GPU_TRAINING_RULES)}) split GPU-minutes over their processes. "
                              f"Fix: set resources.{rule}.runtime")
        processes = stage_params(dict(config), dataset, stages.GPU_TRAINING_RULES[rule])["processes"]
        merged["runtime"] = math.ceil(merged.pop("gpu_minutes") / processes)
    return merged


def scaled(value: int, attempt: int, cap: int | None = None) -> int:
    """Memory or runtime of attempt ``attempt`` (1-based): the first attempt's ``value`` times the attempt number,
    grown to at most ``cap`` (None: no cap); never less than ``value``, which the preflight checks."""
    grown = int(value) * max(1, int(attempt))
    return grown if cap is None else max(int(value), min(grown, int(cap)))


def job_runtime(config: Mapping[str, Any], minutes: int, attempt: int, cap: int | None = None) -> int:
    """Runtime (minutes) of attempt ``attempt`` of a job whose first asks ``minutes``: :func:`scaled` (grown to at
    most ``cap``), and at most the config's ``cluster.max_runtime`` when set."""
    most = (config.get("cluster") or {}).get("max_runtime")
    runtime = scaled(minutes, attempt, cap)
    return runtime if most is None else min(runtime, int(most))


def attempts_needed(config: Mapping[str, Any], minutes: int) -> int:
    """Attempts a job asking ``minutes`` gets in before its run times sum to ``minutes`` (1 without a cap):
    ``--retries`` must be at least this minus 1 for a training of that length to finish, resuming each time."""
    return next(attempt for attempt in range(1, int(minutes) + 1)
                if sum(job_runtime(config, minutes, a) for a in range(1, attempt + 1)) >= minutes)


def failed_attempts(attempt: int, stopped: int, finished: bool = False) -> int:
    """The attempts of a training job that failed, of ``attempt`` so far, ``stopped`` of the earlier ones having
    ended at a time limit or preemption with their checkpoint saved: what memory and runtime scale with, so a
    continuation asks what the attempt before it asked. After a ``finished`` training (its model saved, the job
    stopped before it ended: :func:`dpr_pipeline.training.stops.training_finished`) an attempt has nothing left to
    train and asks what the first asked, whatever ended the one before."""
    return 1 if finished else max(1, int(attempt) - int(stopped))


#: Continuations a training rule gets beyond those its runtime plans for: a preemption, or a time limit that came
#: before the measured runtime said it would.
UNPLANNED_CONTINUATIONS = 2


def training_retries(config: Mapping[str, Any], retries: int, planned) -> dict[str, int]:
    """Per training rule of the plan (``planned``: its training jobs' ``(dataset, rule)``), the retries it gets:
    the failures' ``retries`` plus the continuations its longest planned job needs under ``cluster.max_runtime``
    (:func:`attempts_needed`) and :data:`UNPLANNED_CONTINUATIONS`, so that continuing does not spend a failure
    retry. Only the plan's jobs count: a crash is not resubmitted for the continuations of a dataset not run."""
    needed: dict[str, int] = {}
    for dataset, rule in planned:
        attempts = attempts_needed(config, job_resources(config, dataset, rule)["runtime"])
        needed[rule] = max(needed.get(rule, 1), attempts)
    return {rule: int(retries) + attempts - 1 + UNPLANNED_CONTINUATIONS for rule, attempts in needed.items()}


def planned_trainings(jobs: Iterable) -> list[tuple[str, str]]:
    """The ``(dataset, rule)`` of the training jobs among Snakemake ``jobs`` (:func:`training_retries`'s
    ``planned``)."""
    return [(job.wildcards_dict.get("dataset"), job.rule.name) for job in jobs
            if job.rule.name in stages.GPU_TRAINING_RULES]


def processes_for(resources: Mapping[str, Any]) -> int:
    """Training processes of a job with ``resources`` (a job's Snakemake resources): one per GPU it was given
    (:func:`requested_gpus` on each of its ``nodes``), at least one (a job without GPUs trains in one process on the
    CPU)."""
    return max(1, requested_gpus(resources) * nodes_of(resources))


def nodes_of(resources: Mapping[str, Any]) -> int:
    """The nodes a job's ``resources`` ask for (``nodes``; 1 where not set)."""
    return int(resources.get("nodes") or 1)


def cluster_resources(config: Mapping[str, Any], gpu_rule: bool) -> dict[str, str]:
    """The Slurm plugin's resources of a CPU or GPU rule from the config's ``cluster`` block: ``slurm_partition``
    (``cpu_partition`` or ``gpu_partition``), ``slurm_account``, ``qos`` and, for GPU rules, ``constraint``; a
    setting left null adds nothing (the cluster's default)."""
    cluster = config.get("cluster") or {}
    named = {"slurm_partition": cluster.get("gpu_partition" if gpu_rule else "cpu_partition"),
             "slurm_account": cluster.get("account"), "qos": cluster.get("qos"),
             "constraint": cluster.get("gpu_constraint") if gpu_rule else None}
    return {key: value for key, value in named.items() if value is not None}


def gpu_request(config: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """The resources that ask for ``gpus`` GPUs the way the cluster wants (``cluster.gpu_request``): ``gpu`` (and
    ``gpu_model``), rendered ``--gpus=[model:]N``, or ``gres``, rendered ``--gres=gpu:[model:]N``."""
    cluster = config.get("cluster") or {}
    model = cluster.get("gpu_model")
    if cluster.get("gpu_request", "gpus") == "gres":
        return {"gres": f"gpu:{model}:{gpus}" if model else f"gpu:{gpus}"}
    return {"gpu": gpus, **({"gpu_model": model} if model else {})}


def training_request(config: Mapping[str, Any], processes: int, nodes: int) -> dict[str, Any]:
    """The resources of a training job of ``processes`` processes (one per GPU) over ``nodes`` nodes.

    One node: :func:`gpu_request` and ``nodes: 1``. Over N nodes, what the Slurm plugin renders as ``--nodes=N
    --ntasks=N --gres=gpu:[model:]P/N`` (GRES counts per node; ``--gpus`` would count the job's GPUs, which Slurm
    may place unevenly, and the plugin has no ``--gpus-per-node``); ``mpi`` makes its job step run the job's own
    process on the first node without wrapping it in a one-task srun, so that the job can start one task per node
    itself (:func:`dpr_pipeline.training.nodes.srun_command`); ``tasks_per_gpu: 0`` keeps the plugin from turning
    ``tasks`` into ``--ntasks-per-gpu``. ``threads`` and ``mem_mb`` are then per node (``--cpus-per-task``,
    ``--mem``)."""
    if nodes == 1:
        return {**gpu_request(config, processes), "nodes": 1}
    model = (config.get("cluster") or {}).get("gpu_model")
    per_node = processes // nodes
    return {"gres": f"gpu:{model}:{per_node}" if model else f"gpu:{per_node}", "nodes": nodes, "tasks": nodes,
            "tasks_per_gpu": 0, "mpi": "srun"}


def training_request_keys(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Every key a training job's :func:`training_request` may hold, on one node or several (a rule declares them
    all; a job's value of a key its request lacks is None, which Snakemake leaves out)."""
    return tuple(dict.fromkeys([*training_request(config, 1, 1), *training_request(config, 2, 2)]))


def requested_gpus(resources: Mapping[str, Any]) -> int:
    """The GPUs a job's resources ask for on each of its nodes: ``gpu`` (a one-node job's), or the count of a
    ``gres`` of ``gpu[:model]:N``."""
    if resources.get("gpu"):
        return int(resources["gpu"])
    gres = str(resources.get("gres") or "")
    parts = gres.split(":")
    return int(parts[-1]) if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit() else 0
