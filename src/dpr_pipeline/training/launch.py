"""Run a stage's training function in one process, or in ``processes`` processes under ``torchrun`` (one per GPU).

The Snakemake rules call ``run_training``; with ``processes > 1`` it starts
``torchrun --standalone --nproc_per_node N -m dpr_pipeline.training.launch SPEC`` where SPEC is a JSON file
naming the function and its arguments, and every process calls the function (DDP with cross-device negatives).
The training's checkpoint folder outlives the function and the job: once the function has returned (the model saved)
it is marked finished (:func:`dpr_pipeline.training.stops.mark_finished`), so that whatever stops the job after
that (a time limit while it writes its card and manifest) leaves an attempt with nothing left to train, which asks
the first attempt's resources; a signal that stops the job anywhere in the function is recorded there as a stop (a
continuation, not a failure: :func:`dpr_pipeline.orchestration.resources.failed_attempts`). The Snakemake run
removes the folder once the job has completed (:mod:`dpr_pipeline.orchestration.checkpoints`).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from dpr_pipeline.models.devices import require_cuda_where_allocated
from dpr_pipeline.training.distributed import STAGE_VARIABLE, check_processes, visible_gpus
from dpr_pipeline.training.stops import clear_finished, continuations, mark_finished, record_stop
from dpr_pipeline.training.trainer import stop_signals
from dpr_pipeline.orchestration.job_log import quiet_third_party


def run_training(function: Callable, processes: int, **kwargs) -> None:
    """``function(**kwargs)`` here, or in ``processes`` torchrun processes (kwargs must be JSON values).

    ``kwargs["stage"]`` (the job's stage: ``retriever1``, ``reranker``, ``pretrain/simlm`` …; the function gets it
    too, for the settings its errors name) names the setting in the error when ``processes`` exceeds the visible
    GPUs (:func:`check_processes`), raised before any process starts; a job given GPUs whose torch sees no CUDA
    stops first (:func:`dpr_pipeline.models.devices.require_cuda_where_allocated`)."""
    stage = kwargs.get("stage") or "training"
    require_cuda_where_allocated()
    check_processes(processes, visible_gpus(), stage)
    checkpoint_dir = Path(kwargs["checkpoint_dir"])
    stops = continuations(checkpoint_dir)
    clear_finished(checkpoint_dir)         # a training starts (or resumes): finished again once the function returns
    # SIGTERM (time limit, preemption) in one process: the training loop stops at the end of its step, any other
    # part of the job at once (JobStopped); with workers: this process waits for them rather than die first (a job
    # step whose first process ends has its other processes killed), torchrun passing the signal on to them
    with stop_signals(defer=processes > 1) as received:
        try:
            if processes <= 1:
                function(**kwargs)
            else:
                _run_workers(function, processes, stage, kwargs)
            mark_finished(checkpoint_dir)      # the model is saved: a later attempt has nothing left to train
        finally:
            if received and continuations(checkpoint_dir) == stops:    # stopped where the training loop does not record
                record_stop(checkpoint_dir, None, signal.Signals(received[0]).name)


def _run_workers(function: Callable, processes: int, stage: str, kwargs: dict) -> None:
    """``function(**kwargs)`` in ``processes`` torchrun processes."""
    spec = {"function": f"{function.__module__}:{function.__qualname__}", "kwargs": kwargs}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(spec, out, default=str)
    # the workers import dpr_pipeline as this process does: from the environment it is installed in
    env = {**os.environ, STAGE_VARIABLE: stage}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               "-m", "dpr_pipeline.training.launch", out.name]
    try:
        code = subprocess.Popen(command, env=env).wait()
        if code != 0:
            raise subprocess.CalledProcessError(code, command)
    finally:
        os.unlink(out.name)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_party()
    spec = json.loads(Path(sys.argv[1]).read_text())
    module, name = spec["function"].split(":")
    getattr(importlib.import_module(module), name)(**spec["kwargs"])


if __name__ == "__main__":
    main()
