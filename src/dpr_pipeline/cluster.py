"""Portable job resources of the workflow's rules: CPU threads, memory, runtime and GPUs.

Rules declare only these (the Snakemake names ``threads``, ``mem_mb``, ``runtime`` in minutes, ``gpu``);
partitions, accounts and anything else cluster-specific live in a profile (``profiles/slurm``).

* ``threads``, ``mem_mb``, ``runtime`` of a rule's first attempt come from the config's ``resources`` section
  (``resources.<rule>``, falling back to ``resources.default``), overridden per dataset under
  ``datasets.<name>.resources.<rule>`` (MS MARCO needs hours and tens of GB where the bundled SciFact needs
  minutes and one GB). A retry (``--retries``) multiplies memory and runtime by the attempt number.
* ``gpu``: GPU rules ask for GPUs, CPU rules for none; which rules are GPU rules follows from the stages'
  declaration (:mod:`dpr_pipeline.stages`: ``GPU_TRAINING_RULES``, ``GPU_INFERENCE_RULES``). Training rules ask
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


def processes_for(gpus: int | None) -> int:
    """Training processes of a job that was given ``gpus`` GPUs (``resources.gpu``): one per GPU, at least one
    (a job without GPUs trains in one process on the CPU)."""
    return max(1, int(gpus or 0))
