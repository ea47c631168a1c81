"""Schedules that scale with the data: warm-up as a fraction of the run, and runs that barely train said."""

import copy
import logging

import pytest

from dpr_pipeline.config import ConfigError, validate_config
from dpr_pipeline.training.trainer import FEW_STEPS, TrainingSettings, check_warmup, total_steps


def settings(**changes):
    return TrainingSettings(**{"learning_rate": 1e-3, "warmup_steps": 10, "batch_size": 32, "epochs": 3, **changes})


def test_a_warmup_ratio_is_a_fraction_of_whatever_the_data_makes_the_run():
    ratio = settings(warmup_ratio=0.1)
    assert total_steps(728, ratio) == 66 and ratio.warmup(66) == 7       # the bundled Retriever1 (728 queries)
    assert total_steps(150, ratio) == 12 and ratio.warmup(12) == 1       # the same settings on 150 queries
    assert settings().warmup(12) == 10 and settings(warmup_ratio=0.0).warmup(12) == 0


def test_absolute_warmup_steps_that_take_most_of_the_run_stop_the_job_before_training():
    with pytest.raises(ConfigError, match=r"warmup_steps 10 is more than half of the 12 training step\(s\)"):
        check_warmup(settings(), total_steps(150, settings()), 150, "retriever")
    check_warmup(settings(warmup_ratio=0.1), 12, 150, "retriever")       # the ratio carries over
    check_warmup(settings(warmup_steps=6), 12, 150, "retriever")         # half is allowed


def test_a_run_of_few_steps_is_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        check_warmup(settings(warmup_ratio=0.1), FEW_STEPS - 1, 100, "distilled retriever")
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
    config["datasets"]["a"]["stages"] = {"distill": {"warmup_ratio": 0.9}}
    with pytest.raises(ConfigError, match="warmup_ratio"):
        validate_config(config)
