"""Run a stage's training function (its trainer's in the stage registry, :data:`dpr_pipeline.stages.TRAINERS`) in
one process, or in ``processes`` processes under ``torchrun`` (one per GPU), on one node or over ``nodes`` nodes of
a Slurm job.

The Snakemake rules call ``run_training``; with ``processes > 1`` it writes a JSON spec naming the stage and the
function's arguments (the typed settings and dev selection as params, which the stage's settings class builds again)
beside the training's checkpoints (on the storage every node reads) and starts ``torchrun --standalone
--nproc_per_node N -m dpr_pipeline.training.launch SPEC``; over ``nodes`` > 1 it starts ``srun`` with one task per
node, each of which becomes that node's torchrun, all joining one c10d rendezvous
(:mod:`dpr_pipeline.training.nodes`). Every process calls the function (DDP with cross-device negatives).
The training's checkpoint folder outlives the function and the job: once the function has returned (the model saved)
it is marked finished (:func:`dpr_pipeline.training.stops.mark_finished`), so that whatever stops the job after
that (a time limit while it writes its card and manifest) leaves an attempt with nothing left to train, which asks
the first attempt's resources; a signal that stops the job anywhere in the function is recorded there as a stop (a
continuation, not a failure: :func:`dpr_pipeline.orchestration.resources.failed_attempts`). The Snakemake run
removes the folder once the job has completed (:mod:`dpr_pipeline.orchestration.checkpoints`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from dpr_pipeline.models.devices import require_cuda_where_allocated
from dpr_pipeline.training.distributed import STAGE_VARIABLE, check_processes, stage_setting, visible_gpus
from dpr_pipeline.training.nodes import processes_per_node, require_slurm_job, srun_command, torchrun_command
from dpr_pipeline.stages import settings_class, training_function
from dpr_pipeline.training.settings import DevSelection
from dpr_pipeline.training.stops import clear_finished, continuations, mark_finished, record_stop
from dpr_pipeline.training.trainer import stop_signals
from dpr_pipeline.orchestration.job_log import quiet_third_party

log = logging.getLogger(__name__)


def run_training(stage: str, processes: int, nodes: int = 1, cpus_per_node: int | None = None, **kwargs) -> None:
    """Stage ``stage``'s training function (:func:`dpr_pipeline.stages.training_function`) with ``stage`` and
    ``kwargs`` here, or in ``processes`` torchrun processes (kwargs must be JSON values but ``kwargs["settings"]``,
    the job's :class:`~dpr_pipeline.training.settings.StageSettings`, and ``kwargs["selection"]``, a bi-encoder's
    :class:`~dpr_pipeline.training.settings.DevSelection`), over ``nodes`` nodes of this Slurm job
    (``processes / nodes`` on each, with ``cpus_per_node`` CPUs: the job's threads) where ``nodes`` > 1.

    ``stage`` (``retriever1``, ``reranker``, ``pretrain/simlm`` …; the function gets it too, for the settings its
    errors name) names the setting in the error when ``processes`` does not split over ``nodes``, when a node's
    share exceeds the visible GPUs (:func:`check_processes`), or when ``nodes`` > 1 outside a Slurm job
    (:func:`require_slurm_job`), each raised before any process starts; a job given GPUs whose torch sees no CUDA
    stops first (:func:`dpr_pipeline.models.devices.require_cuda_where_allocated`)."""
    require_cuda_where_allocated()
    nodes_setting = stage_setting(stage, "nodes") or "nodes"
    per_node = processes_per_node(processes, nodes, nodes_setting)
    check_processes(per_node, visible_gpus(), stage)
    if nodes > 1:
        require_slurm_job(os.environ, nodes, stage, nodes_setting)
        if cpus_per_node is None:
            raise ValueError("a training over several nodes needs the CPUs of each node (the job's threads)")
    checkpoint_dir = Path(kwargs["checkpoint_dir"])
    stops = continuations(checkpoint_dir)
    clear_finished(checkpoint_dir)         # a training starts (or resumes): finished again once the function returns
    # SIGTERM (time limit, preemption) in one process: the training loop stops at the end of its step, any other
    # part of the job at once (JobStopped); with workers: this process waits for them rather than die first (a job
    # step whose first process ends has its other processes killed), torchrun passing the signal on to them
    with stop_signals(defer=processes > 1) as received:
        try:
            if processes <= 1:
                training_function(stage)(stage=stage, **kwargs)
            else:
                _run_workers(stage, per_node, nodes, cpus_per_node, kwargs)
            mark_finished(checkpoint_dir)      # the model is saved: a later attempt has nothing left to train
        finally:
            if received and continuations(checkpoint_dir) == stops:    # stopped where the training loop does not record
                record_stop(checkpoint_dir, None, signal.Signals(received[0]).name)


def _run_workers(stage: str, per_node: int, nodes: int, cpus_per_node: int | None, kwargs: dict) -> None:
    """``stage``'s training function with ``kwargs`` in ``per_node`` torchrun processes on each of ``nodes``
    nodes."""
    spec = {"stage": stage, "settings": kwargs["settings"].as_params(),
            "kwargs": {key: value for key, value in kwargs.items() if key not in ("settings", "selection")}}
    if "selection" in kwargs:
        spec["selection"] = kwargs["selection"].as_dict()
    # every node's workers read the spec: beside the checkpoints, on the storage the nodes share
    folder = Path(kwargs["checkpoint_dir"]).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix="launch-", suffix=".json", delete=False) as out:
        json.dump(spec, out, default=str)
    # the workers import dpr_pipeline as this process does: from the environment it is installed in
    env = {**os.environ, STAGE_VARIABLE: stage}
    command = (torchrun_command(per_node, out.name) if nodes == 1
               else srun_command(nodes, per_node, cpus_per_node, out.name))
    if nodes > 1:
        log.info("%s training over %d nodes, %d process(es) on each: %s", stage, nodes, per_node, " ".join(command))
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
    stage = spec["stage"]
    kwargs = {**spec["kwargs"], "settings": settings_class(stage).from_params(spec["settings"], stage)}
    if "selection" in spec:
        kwargs["selection"] = DevSelection.from_dict(spec["selection"])
    training_function(stage)(stage=stage, **kwargs)


if __name__ == "__main__":
    main()
