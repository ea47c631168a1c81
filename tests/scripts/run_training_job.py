"""Run the re-ranker's training job (dpr_pipeline.orchestration.training_job.run_training_job: the training, then the
negatives it grouped, the model card and the manifest) in its own process, as its Snakemake job runs it; tests/test_faults.py
stops it with SIGTERM after its training.

usage: run_training_job.py SPEC.json [--term-in group_negatives|write_job_card]
SPEC.json: {"kwargs": {...}} with the keyword arguments of dpr_pipeline.training.cross_encoder.train_reranker
(tests/test_faults.py, stage_spec), "config": the job's config. The job object holds what a Snakemake job's
``snakemake`` object holds for the rule train_reranker. With --term-in the process sends itself SIGTERM (Slurm's
time limit) as the job enters that part of it, after its training function has returned.
"""

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

import torch
from snakemake.iocontainers import Namedlist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from dpr_pipeline.orchestration import training_job  # noqa: E402
from dpr_pipeline.training.tracking import TrackingRun  # noqa: E402


class Job:
    """What run_training_job reads of a train_reranker job's ``snakemake`` object."""

    def __init__(self, kwargs: dict, config: dict, folder: Path):
        self.input = Namedlist(fromdict={"negatives": kwargs["negatives_path"], "passages": kwargs["passages_path"],
                                         "queries": kwargs["queries_path"]})
        self.output = Namedlist(fromdict={"model": kwargs["output_dir"], "loss_log": kwargs["loss_log"],
                                          "manifest": str(folder / "manifest.json")})
        self.params = Namedlist(fromdict={"reranker": kwargs["params"], "checkpoints": kwargs["checkpoint_dir"],
                                          "tracking": TrackingRun((), "scifact", "reranker")})
        self.resources = Namedlist(fromdict={"gpu": 0})
        self.threads = 1
        self.wildcards = Namedlist(fromdict={"dataset": "scifact"})
        self.rule = "train_reranker"
        self.config = config


def terminate_in(name: str) -> None:
    """Make the job's ``name`` (a name training_job calls after the training) send this process SIGTERM first."""
    original = getattr(training_job, name)

    def terminating(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    setattr(training_job, name, terminating)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--term-in", choices=["group_negatives", "write_job_card"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(args.spec.read_text())
    job = Job(spec["kwargs"], spec["config"], args.spec.parent)
    if args.term_in:
        terminate_in(args.term_in)
    training_job.run_training_job(job, "reranker",
                                  training_job.job_settings("reranker", job.params.reranker), in_batch=False)


if __name__ == "__main__":
    main()
