"""Run a stage's training function in one process, or in ``processes`` processes under ``torchrun`` (one per GPU).

The Snakemake rules call ``run_training``; with ``processes > 1`` it starts
``torchrun --standalone --nproc_per_node N -m dpr_pipeline.training.launch SPEC`` where SPEC is a JSON file
naming the function and its arguments, and every process calls the function (DDP with cross-device negatives).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from ..stages import settings_block
from .distributed import STAGE_VARIABLE


def visible_gpus() -> int:
    """The CUDA devices this process may use (``CUDA_VISIBLE_DEVICES`` applied); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_processes(processes: int, gpus: int, stage: str) -> None:
    """``processes`` training processes need one GPU each where there are GPUs: more processes than the ``gpus``
    visible is a ConfigError naming the setting, the stage and both counts (torchrun would otherwise start, and
    rank ``gpus`` would die in ``torch.cuda.set_device`` with CUDA's ``invalid device ordinal``).

    Without a visible GPU any number of processes trains on the CPU (gloo), as the tests do with two."""
    if processes <= 1 or gpus == 0 or processes <= gpus:
        return
    from ..config import ConfigError

    block = settings_block(stage)  # where the stage's ``processes`` setting lives (stages.py)
    setting = f"stages.{block}.processes" if block else "processes (torchrun's --nproc_per_node)"
    raise ConfigError(
        f"{stage} training: {setting} is {processes} (one process per GPU), but only {gpus} GPU"
        f"{'' if gpus == 1 else 's'} {'is' if gpus == 1 else 'are'} visible to this job. Fix: set "
        f"{'the dataset' + chr(39) + 's ' + setting if block else 'processes'} to {gpus} or less, or run the job "
        f"where {processes} GPUs are visible (CUDA_VISIBLE_DEVICES, the cluster profile's GPUs per job)")


def run_training(function: Callable, processes: int, **kwargs) -> None:
    """``function(**kwargs)`` here, or in ``processes`` torchrun processes (kwargs must be JSON values).

    ``kwargs["stage"]`` (the job's stage: ``retriever1``, ``reranker``, ``pretrain/simlm`` …; the function gets it
    too, for the settings its errors name) names the setting in the error when ``processes`` exceeds the visible
    GPUs (:func:`check_processes`), raised before any process starts."""
    stage = kwargs.get("stage") or "training"
    check_processes(processes, visible_gpus(), stage)
    if processes <= 1:
        function(**kwargs)
        return
    spec = {"function": f"{function.__module__}:{function.__qualname__}", "kwargs": kwargs}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(spec, out, default=str)
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
           STAGE_VARIABLE: stage}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               "-m", "dpr_pipeline.training.launch", out.name]
    try:
        # SIGTERM reaches every process of a Slurm job at once (time limit, preemption): torchrun passes it on to
        # its workers, which save a checkpoint before they exit; this process waits for them rather than die
        # first (a job step whose first process ends has its other processes killed)
        from .trainer import stop_signals

        with stop_signals():
            code = subprocess.Popen(command, env=env).wait()
        if code != 0:
            raise subprocess.CalledProcessError(code, command)
    finally:
        os.unlink(out.name)


def main() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(sys.argv[1]).read_text())
    module, name = spec["function"].split(":")
    getattr(importlib.import_module(module), name)(**spec["kwargs"])


if __name__ == "__main__":
    main()
