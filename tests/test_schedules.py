"""Schedules that scale with the data: warm-up as a fraction of the run, and runs that barely train said."""

import copy
import logging
from pathlib import Path

import pytest
import yaml

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.training.schedule import FEW_STEPS, STEP_KEYS, TrainingSettings, check_warmup, total_steps
from dpr_pipeline.orchestration.config import stage_params, validate_config


def settings(**changes):
    return TrainingSettings(**{"learning_rate": 1e-3, "warmup_steps": 10, "batch_size": 32, "epochs": 3, "min_steps": 0,
                                **changes})


def test_a_warmup_ratio_is_a_fraction_of_whatever_the_data_makes_the_run():
    ratio = settings(warmup_ratio=0.1)
    assert total_steps(728, ratio) == 66 and ratio.warmup(66) == 7       # the bundled Retriever1 (728 queries)
    assert total_steps(150, ratio) == 12 and ratio.warmup(12) == 1       # the same settings on 150 queries
    assert settings().warmup(12) == 10 and settings(warmup_ratio=0.0).warmup(12) == 0


def test_min_steps_lengthens_only_a_run_whose_epochs_give_fewer_steps(caplog):
    floor = settings(warmup_ratio=0.1, min_steps=40)
    assert total_steps(160, floor) == 40                                 # 160 queries x 3 epochs: 15 steps
    assert total_steps(728, floor) == 66                                 # the bundled Retriever1 keeps its 66
    assert total_steps(160, settings(min_steps=40, train_steps=12)) == 12  # a fixed budget is the user's
    assert total_steps(160, settings(min_steps=0)) == 15
    with caplog.at_level(logging.INFO):
        check_warmup(floor, total_steps(160, floor), 160, "retriever", "retriever1")
    assert "40 optimizer steps (stages.retriever1.min_steps 40" in caplog.text and "make only 15" in caplog.text
    assert "8.0 epochs" in caplog.text


def test_the_bundled_stages_are_above_the_default_floor():
    """The default min_steps leaves the bundled SciFact chain's step counts as they were (Retriever1/2 66 steps,
    re-ranker 182, distilled retriever 45), so its results and time do not change."""
    config = yaml.safe_load(Path("config.yaml").read_text())
    validate_config(config)
    train_queries = 809 - 81                                             # dev_split carves 81 of SciFact's 809
    for block, expected in (("retriever", 66), ("reranker", 182), ("distill", 45)):
        params = stage_params(config, "scifact", block)
        assert params["min_steps"] < expected
        steps = TrainingSettings(**{key: params[key] for key in ("learning_rate", "warmup_steps", *STEP_KEYS)
                                    if key in params})
        assert total_steps(train_queries, steps) == expected


def test_absolute_warmup_steps_that_take_most_of_the_run_stop_the_job_before_training():
    with pytest.raises(ConfigError, match=r"warmup_steps 10 is more than half of the 12 training step\(s\)"):
        check_warmup(settings(), total_steps(150, settings()), 150, "retriever", "retriever2")
    check_warmup(settings(warmup_ratio=0.1), 12, 150, "retriever")       # the ratio carries over
    check_warmup(settings(warmup_steps=6), 12, 150, "retriever")         # half is allowed


def test_a_run_of_few_steps_is_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        check_warmup(settings(warmup_ratio=0.1), FEW_STEPS - 1, 100, "distilled retriever", "distill")
    assert f"only {FEW_STEPS - 1} optimizer step(s)" in caplog.text and "stages.distill.epochs" in caplog.text


BASE = {"run_datasets": ["a"], "datasets": {"a": {"format": "beir", "path": "data/scifact", "train_split": "train",
                                                  "eval_splits": ["test"]}}}


def test_the_config_takes_a_ratio_and_checks_fixed_budgets_at_start_up():
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"] = {"distill": {"warmup_ratio": 0.1, "train_steps": 10}}
    validate_config(config)                                              # a ratio never exceeds half
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"] = {"distill": {"warmup_steps": 6, "train_steps": 10}}
    with pytest.raises(ConfigError, match="6 warm-up steps are more than half of the 10 training steps"):
        validate_config(config)
    config["datasets"]["a"]["stages"] = {"retriever2": {"warmup_steps": 6, "train_steps": 10}}   # an own block too
    with pytest.raises(ConfigError, match=r"^config key datasets\.a\.stages\.retriever2\.warmup_steps: 6 warm-up"):
        validate_config(config)
    config["datasets"]["a"]["stages"] = {"retriever": {"train_steps": 10}, "retriever1": {"warmup_steps": 6}}
    with pytest.raises(ConfigError, match=r"^config key datasets\.a\.stages\.retriever1\.warmup_steps: 6 warm-up"):
        validate_config(config)
    config["datasets"]["a"]["stages"] = {"distill": {"warmup_ratio": 0.9}}
    with pytest.raises(ConfigError, match="warmup_ratio"):
        validate_config(config)
