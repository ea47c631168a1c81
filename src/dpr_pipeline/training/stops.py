"""A training's stops by a signal (its time limit, a preemption), one JSON line each in its checkpoint folder's
:data:`STOPS_FILE`: the trainer and the training job write them, the job's resources read how many there are (an
attempt after a stop continues the training: no failure, :func:`dpr_pipeline.orchestration.resources.failed_attempts`).
Nothing here loads torch: Snakemake reads the count when it plans a retry."""

from __future__ import annotations

import json
from pathlib import Path

STOPS_FILE = "stops.jsonl"


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
