"""A training's stops by a signal (its time limit, a preemption), one JSON line each in its checkpoint folder's
:data:`STOPS_FILE`: the trainer and the training job write them, the job's resources read how many there are (an
attempt after a stop continues the training: no failure, :func:`dpr_pipeline.orchestration.resources.failed_attempts`).
Once the training function has returned (its model saved), the folder also holds :data:`FINISHED_FILE`: an attempt
after that has nothing left to train and asks what the first attempt asked, whatever stopped the job after its
training (a time limit while the job writes its other outputs, Snakemake's bookkeeping); the Snakemake run removes
the folder once the job's model is in place (:mod:`dpr_pipeline.orchestration.checkpoints`).
Nothing here loads torch: Snakemake reads these when it plans a retry."""

from __future__ import annotations

import json
from pathlib import Path

STOPS_FILE = "stops.jsonl"
FINISHED_FILE = "finished"


def record_stop(checkpoint_dir: str | Path, step: int | None, signal_name: str) -> None:
    """Append a stop (at training step ``step``; None: outside the training loop) to ``checkpoint_dir``'s file."""
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(checkpoint_dir) / STOPS_FILE, "a", encoding="utf-8") as out:
        out.write(json.dumps({"step": step, "signal": signal_name}) + "\n")


def continuations(checkpoint_dir: str | Path) -> int:
    """How many times a training stopped by a signal since it last started afresh (the lines of its stops file)."""
    try:
        return len(Path(checkpoint_dir, STOPS_FILE).read_text(encoding="utf-8").splitlines())
    except OSError:
        return 0


def mark_finished(checkpoint_dir: str | Path) -> None:
    """Record in ``checkpoint_dir`` that its training function has returned: its model is saved and the folder's
    last checkpoint is that of the last step."""
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    Path(checkpoint_dir, FINISHED_FILE).touch()


def clear_finished(checkpoint_dir: str | Path) -> None:
    """Take back :func:`mark_finished` as a training (a resumed one included) starts in ``checkpoint_dir``."""
    Path(checkpoint_dir, FINISHED_FILE).unlink(missing_ok=True)


def training_finished(checkpoint_dir: str | Path) -> bool:
    """Whether the training of ``checkpoint_dir`` has finished (:func:`mark_finished`) and not started since."""
    return Path(checkpoint_dir, FINISHED_FILE).is_file()
