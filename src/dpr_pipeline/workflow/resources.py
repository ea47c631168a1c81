"""Portable job resources of the workflow's rules: CPU threads, memory, runtime and GPUs.

Rules declare only these (the Snakemake names ``threads``, ``mem_mb``, ``runtime`` in minutes, ``gpu``);
partitions, accounts and anything else cluster-specific live in a profile (``profiles/slurm``).

* ``threads``, ``mem_mb``, ``runtime`` of a rule's first attempt come from the config's ``resources`` section
  (``resources.<rule>``, falling back to ``resources.default``), overridden per dataset under
  ``datasets.<name>.resources.<rule>`` (MS MARCO needs hours and tens of GB where the bundled SciFact needs
  minutes and one GB). A retry (``--retries``) multiplies memory and runtime by the attempt number; the
  runtime of every attempt is at most ``cluster.max_runtime`` (the partition's longest job) when that is set
  (:func:`job_runtime`): a training longer than that runs as several attempts, each resuming from the checkpoint
  the one before saved when its time limit's SIGTERM came (:mod:`dpr_pipeline.training.trainer`).
* ``nodes``: 1 for the GPU rules, whose multi-GPU trainers run ``torchrun --standalone`` (one node), so that
  Slurm never spreads a job's GPUs over several nodes (``sbatch --nodes=1``).
* ``gpu``: GPU rules ask for GPUs, CPU rules for none; which rules are GPU rules follows from the stages'
  declaration (:mod:`dpr_pipeline.workflow.stages`: ``GPU_TRAINING_RULES``, ``GPU_INFERENCE_RULES``). Training rules ask
  for the stage's ``processes`` GPUs and launch ``torchrun --nproc_per_node={resources.gpu}`` (one process per
  GPU, :func:`processes_for`); encoding, search, re-ranking and teacher scoring ask for one GPU per job (more
  parallelism = more shards).
"""

from __future__ import annotations

from typing import Any, Mapping

#: The first attempt's resources of a rule that ``resources`` does not name.
BUILTIN_DEFAULT = {"threads": 1, "mem_mb": 4000, "runtime": 60}


def job_resources(config: Mapping[str, Any], dataset: str, rule: str) -> dict[str, int]:
    """``threads``, ``mem_mb``, ``runtime`` (minutes) of ``rule``'s first attempt for ``dataset``."""
    resources = config.get("resources") or {}
    merged = {**BUILTIN_DEFAULT, **(resources.get("default") or {}), **(resources.get(rule) or {})}
    per_dataset = (config["datasets"][dataset].get("resources") or {})
    merged.update(per_dataset.get("default") or {})
    merged.update(per_dataset.get(rule) or {})
    return merged


def scaled(value: int, attempt: int) -> int:
    """Memory or runtime of attempt ``attempt`` (1-based): the first attempt's times the attempt number."""
    return int(value) * max(1, int(attempt))


def job_runtime(config: Mapping[str, Any], minutes: int, attempt: int) -> int:
    """Runtime (minutes) of attempt ``attempt`` of a job whose first asks ``minutes``: :func:`scaled`, capped at
    the config's ``cluster.max_runtime`` when set."""
    cap = (config.get("cluster") or {}).get("max_runtime")
    return scaled(minutes, attempt) if cap is None else min(scaled(minutes, attempt), int(cap))


def attempts_needed(config: Mapping[str, Any], minutes: int) -> int:
    """Attempts a job asking ``minutes`` gets in before its run times sum to ``minutes`` (1 without a cap):
    ``--retries`` must be at least this minus 1 for a training of that length to finish, resuming each time."""
    return next(attempt for attempt in range(1, int(minutes) + 1)
                if sum(job_runtime(config, minutes, a) for a in range(1, attempt + 1)) >= minutes)


def short_of_retries(config: Mapping[str, Any], retries: int, training_rules) -> str | None:
    """The warning to print when, under ``cluster.max_runtime``, a training job of some dataset needs more
    attempts (:func:`attempts_needed`) than ``1 + retries``: each names its dataset, rule, runtime and attempts;
    None when every training fits."""
    cap = (config.get("cluster") or {}).get("max_runtime")
    if cap is None:
        return None
    short = [(dataset, rule, minutes, attempts_needed(config, minutes)) for dataset in config["datasets"]
             for rule in training_rules for minutes in [job_resources(config, dataset, rule)["runtime"]]
             if attempts_needed(config, minutes) > 1 + retries]
    if not short:
        return None
    return (f"cluster.max_runtime is {cap} min, so these trainings run as several attempts, each resuming from the "
            f"checkpoint of the one before, but --retries is {retries}: "
            + "; ".join(f"{d}'s {rule} ({minutes} min: {n} attempts)" for d, rule, minutes, n in short)
            + f". Fix: run with --retries {max(n for *_, n in short) - 1} or more, or raise cluster.max_runtime")


def processes_for(gpus: int | None) -> int:
    """Training processes of a job that was given ``gpus`` GPUs (``resources.gpu``): one per GPU, at least one
    (a job without GPUs trains in one process on the CPU)."""
    return max(1, int(gpus or 0))
