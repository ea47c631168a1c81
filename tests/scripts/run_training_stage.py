"""Run one training stage's plain function in its own process; tests/test_faults.py kills it with SIGKILL.

usage: run_training_stage.py SPEC.json [SPEC.json ...] [--kill-at-step N]
Runs the specs one after the other (one process start for several stages). Each SPEC.json:
{"stage": "pretrain" | "retriever" | "reranker" | "distill", "kwargs": {...}} with the keyword arguments
of dpr_pipeline.pretraining.train.pretrain, dpr_pipeline.training.biencoder.train_biencoder or
dpr_pipeline.training.cross_encoder.train_reranker (``params`` in place of ``settings``: the stage's class built
from them), run as a job runs them (dpr_pipeline.training.launch.run_training, for retriever1, distill, reranker or
pretrain/<method>). With --kill-at-step N the process sends itself SIGKILL (kill -9: no
cleanup, no exception handlers, no atexit) right after the optimizer step N, before that step's loss line
and checkpoint are written, so the kill always lands mid-run at the same place.
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from dpr_pipeline.training import trainer  # noqa: E402


def kill_at_step(step: int) -> None:
    """Make the trainer's progress bar SIGKILL this process when it reaches ``step``."""

    class KillingProgress(trainer.tqdm):
        def update(self, n=1):
            result = super().update(n)
            if self.n >= step:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

    trainer.tqdm = KillingProgress


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", type=Path, nargs="+")
    parser.add_argument("--kill-at-step", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.kill_at_step:
        kill_at_step(args.kill_at_step)
    for path in args.specs:
        run(json.loads(path.read_text()))


def run(spec: dict) -> None:
    """The stage's function in one process, as its job runs it (run_training: the checkpoint folder is marked
    finished after)."""
    from dpr_pipeline.training.launch import run_training
    from dpr_pipeline.stages import PRETRAINING, member, settings_class
    kwargs = {key: value for key, value in spec["kwargs"].items() if key != "params"}
    params = spec["kwargs"]["params"]
    if spec["stage"] == "pretrain":
        stage = member(PRETRAINING, params["method"])
    else:
        stage = {"retriever": "retriever1", "distill": "distill", "reranker": "reranker"}.get(spec["stage"])
    if stage is None:
        raise SystemExit(f"unknown stage {spec['stage']!r}")
    run_training(stage, 1, **kwargs, settings=settings_class(stage).from_params(params))


if __name__ == "__main__":
    main()
