"""Portable job resources (config `resources`, per dataset, attempt-scaled) and shard-bounded teacher reads."""

import yaml
from conftest import REPO

from dpr_pipeline.workflow.resources import (
    attempts_needed,
    job_resources,
    job_runtime,
    processes_for,
    scaled,
    short_of_retries,
)

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


def test_resources_merge_default_rule_and_dataset():
    assert job_resources(CONFIG, "scifact", "train_retriever") == {"threads": 8, "mem_mb": 4000, "runtime": 60}
    assert job_resources(CONFIG, "scifact", "evaluate") == {"threads": 1, "mem_mb": 4000, "runtime": 60}
    msmarco = job_resources(CONFIG, "msmarco", "train_reranker")
    assert msmarco == {"threads": 32, "mem_mb": 256000, "runtime": 2880}
    assert job_resources(CONFIG, "msmarco", "plot_metrics") == {"threads": 4, "mem_mb": 16000, "runtime": 120}


def test_retries_scale_memory_and_runtime_and_gpus_give_processes():
    assert [scaled(2000, attempt) for attempt in (1, 2, 3)] == [2000, 4000, 6000]
    assert [processes_for(gpus) for gpus in (None, 0, 1, 4)] == [1, 1, 1, 4]


def test_max_runtime_caps_every_attempt_and_says_when_retries_are_too_few():
    """cluster.max_runtime, the partition's longest job: 48 h re-ranker training asks 24 h on every attempt
    under a 24 h cap (2 attempts resuming from the checkpoint: --retries 1), MS MARCO's 72 h pre-training 3
    attempts, NQ's 120 h 5."""
    capped = {**CONFIG, "cluster": {"max_runtime": 1440}}
    assert [job_runtime(CONFIG, 2880, attempt) for attempt in (1, 2, 3)] == [2880, 5760, 8640]   # no cap
    assert [job_runtime(capped, 2880, attempt) for attempt in (1, 2, 3)] == [1440, 1440, 1440]
    assert [job_runtime(capped, 600, attempt) for attempt in (1, 2, 3)] == [600, 1200, 1440]
    assert [attempts_needed(capped, minutes) for minutes in (60, 1440, 2880, 4320)] == [1, 1, 2, 3]
    assert attempts_needed(CONFIG, 4320) == 1
    training = ["pretrain", "train_reranker"]
    assert short_of_retries(CONFIG, 0, training) is None and short_of_retries(capped, 4, training) is None
    message = short_of_retries(capped, 1, training)
    assert "cluster.max_runtime is 1440 min" in message and "--retries is 1" in message
    assert "msmarco's pretrain (4320 min: 3 attempts)" in message and "nq's pretrain (7200 min: 5 attempts)" in message
    assert "train_reranker" not in message                                  # 2 attempts: --retries 1 is enough
    assert message.endswith("Fix: run with --retries 4 or more, or raise cluster.max_runtime")
