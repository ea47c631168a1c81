"""The pre-training methods' registry (pretraining/methods.py): the schema's lists follow it, Snakemake can read it
without torch, and what a method declares reaches its data and its manifest. What the model builds from a
declaration: tests/test_pretraining_objectives.py."""

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import REPO

from dpr_pipeline.pretraining.methods import METHODS, ObjectiveSettings, pretraining_method
from dpr_pipeline.pretraining.train import PassageData
from dpr_pipeline.orchestration.config import validate_config

SCHEMA = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
NAMES = list(METHODS)


def test_the_schemas_lists_of_methods_are_the_registry_in_its_order():
    pretrain = SCHEMA["$defs"]["pretrain"]["properties"]
    assert pretrain["method"]["enum"] == NAMES
    assert pretrain["ablation_methods"]["items"]["enum"] == ["none", *NAMES]
    transfer_stages = SCHEMA["properties"]["transfer"]["properties"]["stages"]["items"]["enum"]
    assert [s for s in transfer_stages if s.startswith("ablation/")] == [f"ablation/{m}" for m in ["none", *NAMES]]


def test_the_default_ablation_runs_every_registered_method():
    dataset = {"format": "beir", "path": "p", "train_split": "train", "eval_splits": ["test"]}
    config = validate_config({"datasets": {"scifact": dataset}})
    assert config["stages"]["pretrain"]["ablation_methods"] == ["none", *NAMES]


def test_a_method_is_found_by_its_name_and_an_unknown_name_lists_the_registered_ones():
    assert all(pretraining_method(name).name == name for name in NAMES)
    with pytest.raises(ValueError, match=re.escape(f"'bert': use one of {tuple(NAMES)}")):
        pretraining_method("bert")


def test_the_registry_imports_without_torch():
    """Snakemake reads it when it plans (rules/pretrain.smk): importing torch there would cost seconds per run."""
    code = ("import sys; import dpr_pipeline.pretraining.methods; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / "src")})
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("method", NAMES)
def test_the_settings_a_decoder_declares_are_pretraining_settings(method):
    decoder = METHODS[method].decoder
    names = decoder.settings if decoder else ()
    fields = {f.name for f in dataclasses.fields(ObjectiveSettings)}
    assert set(names) <= fields & set(SCHEMA["$defs"]["pretrain"]["properties"])


@pytest.mark.parametrize("method", NAMES)
def test_span_pairs_give_two_spans_per_passage_and_in_batch_negatives_in_the_manifest(method):
    declared = METHODS[method]
    corpus = [np.array([101, *range(1000, 1020), 102])]
    example = PassageData(corpus, span_pairs=declared.span_pairs, seed=0).example(0, epoch=0)
    assert len(example) == (2 if declared.span_pairs else 1)
    negatives = declared.negatives(batch_size=8)
    assert negatives == ({"in_batch": True, "batch_size": 8, "effective_per_query": 14} if declared.span_pairs
                         else None)
