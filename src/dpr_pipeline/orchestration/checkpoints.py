"""The training checkpoint folders a Snakemake run removes as it ends (the Snakefile's ``onsuccess`` and ``onerror``)
and as it starts (``onstart``); never in a dry run, nor in a cluster job's own Snakemake (Snakemake runs no hooks
there).

A training job does not remove its checkpoint folder (``results/<dataset>/checkpoints/<stage>``,
:func:`dpr_pipeline.layout.checkpoint_dir`): its training function marks it finished once the model is saved
(:func:`dpr_pipeline.training.stops.mark_finished`), and the job goes on to write its other outputs. A time limit or
a preemption there leaves the folder with the last step's checkpoint and the stops so far, so the next attempt has
nothing left to train and asks the first attempt's resources
(:func:`dpr_pipeline.orchestration.resources.failed_attempts`). The folder is done with once the job has completed:
its model (:func:`dpr_pipeline.layout.model_dir`, the training rule's output) is in place, Snakemake having removed
the outputs of a job that failed. Removing the finished folders of completed jobs as a run starts, too, keeps a
training that Snakemake reruns (a changed input or setting) from resuming one of them, where an earlier run ended
without its hooks (its Snakemake killed).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dpr_pipeline.layout import RESULTS, checkpoint_dir, dataset_dir, model_dir
from dpr_pipeline.training.stops import FINISHED_FILE


def finished_checkpoints(workdir: str | Path = ".") -> list[tuple[Path, Path]]:
    """Every finished training checkpoint folder under ``workdir``'s ``results/<dataset>/checkpoints/`` with its
    stage's model folder, (checkpoint folder, model folder), the stage read from the folder's path (``retriever1``,
    ``pretrain/simlm``)."""
    found = []
    results = Path(workdir, RESULTS)
    for dataset in sorted(p.name for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        checkpoints = Path(workdir, checkpoint_dir("", dataset))          # results/<dataset>/checkpoints
        for marker in sorted(checkpoints.rglob(FINISHED_FILE)):
            if marker.is_file():
                stage = marker.parent.relative_to(checkpoints).as_posix()
                found.append((marker.parent, Path(workdir, model_dir(stage, dataset))))
    return found


def remove_finished_checkpoints(workdir: str | Path = ".") -> list[Path]:
    """Remove the finished checkpoint folders (:func:`finished_checkpoints`) whose model folder exists: those of
    the trainings whose jobs completed. A folder not finished (a training under way, or stopped mid-run) stays, and
    so does a finished one whose model is missing (its job stopped after the training and failed: the next attempt
    resumes it with nothing left to train). The folders the removals leave empty below the dataset's go too
    (``checkpoints/pretrain``, ``checkpoints``). Returns the removed folders."""
    removed = []
    for folder, model in finished_checkpoints(workdir):
        if not model.is_dir():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if folder.exists():
            continue
        removed.append(folder)
        dataset_folder = Path(workdir, dataset_dir(folder.relative_to(Path(workdir, RESULTS)).parts[0]))
        for parent in folder.parents:
            if parent == dataset_folder or any(parent.iterdir()):
                break
            parent.rmdir()
    return removed
