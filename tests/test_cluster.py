"""Portable job resources (config `resources`, per dataset, attempt-scaled) and shard-bounded teacher reads."""

import pytest
import yaml
from conftest import REPO

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.training.stops import clear_finished, continuations, mark_finished, record_stop, training_finished
from dpr_pipeline.orchestration.resources import (
    UNPLANNED_CONTINUATIONS,
    attempts_needed,
    failed_attempts,
    job_resources,
    job_runtime,
    processes_for,
    scaled,
    training_retries,
)

CONFIG = validate_config({**yaml.safe_load((REPO / "config.yaml").read_text()), "run_datasets": ["scifact", "msmarco", "nq"]})


def test_resources_merge_default_rule_and_dataset():
    assert job_resources(CONFIG, "scifact", "train_retriever") == {"threads": 8, "mem_mb": 4000, "runtime": 60}
    assert job_resources(CONFIG, "scifact", "evaluate") == {"threads": 1, "mem_mb": 4000, "runtime": 60}
    msmarco = job_resources(CONFIG, "msmarco", "train_reranker")
    assert msmarco == {"threads": 32, "mem_mb": 256000, "runtime": 720}
    assert job_resources(CONFIG, "msmarco", "plot_metrics") == {"threads": 4, "mem_mb": 16000, "runtime": 120}


def test_retries_scale_memory_and_runtime_and_gpus_give_processes():
    assert [scaled(2000, attempt) for attempt in (1, 2, 3)] == [2000, 4000, 6000]
    assert [processes_for({"gpu": gpus}) for gpus in (None, 0, 1, 4)] == [1, 1, 1, 4]
    assert [processes_for({"gres": gres}) for gres in ("gpu:4", "gpu:a100:2", "gpu", "shard:3")] == [4, 2, 1, 1]


def test_max_runtime_caps_every_attempt_and_the_continuations_come_on_top_of_the_retries():
    """cluster.max_runtime, the partition's longest job: 48 h re-ranker training asks 24 h on every attempt
    under a 24 h cap (2 attempts resuming from the checkpoint), NQ's 120 h pre-training 5; each training rule of
    the plan gets its planned jobs' continuations on top of --retries, which stay for failures."""
    capped, uncapped = {**CONFIG, "cluster": {"max_runtime": 1440}}, {**CONFIG, "cluster": {"max_runtime": None}}
    assert [job_runtime(uncapped, 2880, attempt) for attempt in (1, 2, 3)] == [2880, 5760, 8640]   # no cap
    assert [job_runtime(capped, 2880, attempt) for attempt in (1, 2, 3)] == [1440, 1440, 1440]
    assert [job_runtime(capped, 600, attempt) for attempt in (1, 2, 3)] == [600, 1200, 1440]
    assert [attempts_needed(capped, minutes) for minutes in (60, 1440, 2880, 4320)] == [1, 1, 2, 3]
    assert attempts_needed(uncapped, 4320) == 1
    unplanned = UNPLANNED_CONTINUATIONS                                   # a preemption, an early time limit
    msmarco = [("msmarco", "pretrain"), ("msmarco", "train_reranker"), ("msmarco", "train_retriever")]
    assert training_retries(uncapped, 2, msmarco) == {rule: 2 + unplanned for _, rule in msmarco}   # no cap
    assert training_retries(capped, 2, msmarco) == {"pretrain": 2 + 0 + unplanned,               # 24 h: 1 attempt
                                                     "train_reranker": 2 + 0 + unplanned,
                                                     "train_retriever": 2 + 0 + unplanned}
    assert training_retries(capped, 2, [("nq", "pretrain")]) == {"pretrain": 2 + 4 + unplanned}  # 120 h: 5 attempts
    assert training_retries(capped, 2, []) == {}                         # nothing planned: nothing set


def test_a_trainings_gpu_minutes_are_split_over_its_processes_and_plan_its_continuations():
    """msmarco's trainings are written in GPU-minutes: pre-training's 8 x 24 h asks 24 h on 8 GPUs and 96 h on 2,
    which under a 12 h cap is 8 attempts where 8 GPUs need 2 (the continuations planned, none spent from --retries);
    a more specific level's runtime replaces them, and a rule that trains nothing cannot use them."""
    on_gpus = lambda processes, **cluster: {**CONFIG, "cluster": cluster, "datasets": {**CONFIG["datasets"], "msmarco": {
        **CONFIG["datasets"]["msmarco"], "stages": {**CONFIG["datasets"]["msmarco"]["stages"], "pretrain": {
            **CONFIG["datasets"]["msmarco"]["stages"]["pretrain"], "processes": processes}}}}}
    assert job_resources(on_gpus(8), "msmarco", "pretrain")["runtime"] == 1440
    assert job_resources(on_gpus(2), "msmarco", "pretrain")["runtime"] == 5760
    assert job_resources(on_gpus(3), "msmarco", "pretrain")["runtime"] == 3840
    plan = [("msmarco", "pretrain")]
    assert training_retries(on_gpus(8, max_runtime=720), 2, plan) == {"pretrain": 2 + 1 + UNPLANNED_CONTINUATIONS}
    assert training_retries(on_gpus(2, max_runtime=720), 2, plan) == {"pretrain": 2 + 7 + UNPLANNED_CONTINUATIONS}
    overridden = on_gpus(2)
    msmarco = overridden["datasets"]["msmarco"]
    overridden["datasets"]["msmarco"] = {**msmarco, "resources": {**msmarco["resources"], "pretrain": {"runtime": 90}}}
    assert job_resources(overridden, "msmarco", "pretrain")["runtime"] == 90
    both = {**msmarco["resources"]["pretrain"], "runtime": 80}          # a --configfile overlay merged into it
    overridden["datasets"]["msmarco"] = {**msmarco, "resources": {**msmarco["resources"], "pretrain": both}}
    assert job_resources(overridden, "msmarco", "pretrain")["runtime"] == 80
    with pytest.raises(ConfigError, match=r"resources.evaluate.gpu_minutes: only the training rules .* Fix: set "
                                          r"resources.evaluate.runtime"):
        job_resources({**CONFIG, "resources": {"evaluate": {"gpu_minutes": 60}}}, "scifact", "evaluate")


def test_a_continuation_asks_what_the_attempt_before_it_asked(tmp_path):
    """A training stopped at its time limit (its stop recorded beside the checkpoint) is continued, not failed:
    memory and runtime scale with the failed attempts only."""
    assert continuations(tmp_path / "none") == 0
    assert [failed_attempts(attempt, 0) for attempt in (1, 2, 3)] == [1, 2, 3]          # failures
    record_stop(tmp_path, 120, "SIGTERM")
    record_stop(tmp_path, 240, "SIGTERM")
    assert continuations(tmp_path) == 2
    assert [failed_attempts(attempt, 2) for attempt in (1, 2, 3)] == [1, 1, 1]          # two time limits
    assert failed_attempts(4, 2) == 2                                                     # then one failure


def test_an_attempt_after_a_finished_training_asks_what_the_first_asked(tmp_path):
    """A training that finished (its model saved) and whose job was then stopped (a time limit while it wrote its
    card, Snakemake's bookkeeping after it) has nothing left to train: its next attempt asks the first attempt's
    memory and runtime, however many attempts failed or stopped before; a training that starts again is not
    finished until its function returns again."""
    assert not training_finished(tmp_path / "none")
    record_stop(tmp_path, 120, "SIGTERM")
    mark_finished(tmp_path)
    assert training_finished(tmp_path) and continuations(tmp_path) == 1
    # the CI run: a time limit mid-training (a stop), then one after the training (no stop recorded)
    assert failed_attempts(3, continuations(tmp_path)) == 2
    assert [failed_attempts(attempt, 1, training_finished(tmp_path)) for attempt in (2, 3, 5)] == [1, 1, 1]
    assert scaled(2000, failed_attempts(3, 1, finished=True)) == 2000
    assert job_runtime(CONFIG, 60, failed_attempts(3, 1, finished=True)) == 60
    clear_finished(tmp_path)
    assert not training_finished(tmp_path) and failed_attempts(3, continuations(tmp_path)) == 2
