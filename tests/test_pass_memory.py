"""The training pass's memory estimate (training/pass_memory.py) against what was measured on an H200, and
`micro_batch_size: auto`'s choice: the largest divisor of the share that fits, one pass where all of it fits."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from conftest import make_tiny_bert
from test_training import write_training_data

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.training.pass_memory import (USABLE_SHARE, fitting_micro_batch, model_size, pass_gib,
                                               resolve_micro_batch)
from dpr_pipeline.training.schedule import TrainingSettings
from dpr_pipeline.training.settings import BiEncoderSettings

BERT_BASE = {"parameters": 109_482_240, "hidden_size": 768, "layers": 12}
ELECTRA_BASE = {"parameters": 108_893_186, "hidden_size": 768, "layers": 12}
RETRIEVER_QUERY = 32 + 16 * 144          # Table 13: a query and its 1 + 15 passages
RERANKER_QUERY = 64 * 192                # the msmarco re-ranker's 64 pairs of 192 tokens


@pytest.mark.parametrize("tokens, model, measured", [
    (64 * RETRIEVER_QUERY, BERT_BASE, 57.9),      # benchmarks/README.md: finetune_throughput, one pass
    (16 * RETRIEVER_QUERY, BERT_BASE, 16.0),      # gradient cache, chunks of 16 queries
    (4 * RETRIEVER_QUERY, BERT_BASE, 5.5),        # chunks of 4
    (8 * RERANKER_QUERY, ELECTRA_BASE, 38.6),     # reranker_memory.py, the whole share
    (2 * RERANKER_QUERY, ELECTRA_BASE, 11.2),     # micro_batch_size 2
])
def test_the_estimate_is_within_7_percent_of_every_measured_peak(tokens, model, measured):
    assert pass_gib(tokens, **model) == pytest.approx(measured, rel=0.07)


def test_the_estimate_by_hand():
    # 1e8 parameters x 16 B = 1.490 GiB; 1024 tokens x 0.385 MiB = 0.385 GiB at 768 x 12; half the depth: half;
    # float32 activations: twice
    model = {"parameters": 100_000_000, "hidden_size": 768, "layers": 12}
    assert pass_gib(1024, **model) == pytest.approx(1e8 * 16 / 2**30 + 0.385)
    assert pass_gib(1024, **{**model, "layers": 6}) == pytest.approx(1e8 * 16 / 2**30 + 0.385 / 2)
    assert pass_gib(1024, **model, bf16=False) == pytest.approx(1e8 * 16 / 2**30 + 0.77)


def test_auto_picks_the_largest_divisor_of_the_share_that_fits():
    # the distilled retriever on 2 GPUs of 40 GB: 32 queries x (32 + 24 x 144) tokens ≈ 43.6 GiB, over 85 % of 40
    distill_query = 32 + 24 * 144
    assert pass_gib(32 * distill_query, **BERT_BASE) == pytest.approx(43.6, abs=0.1)
    assert fitting_micro_batch(32, distill_query, 40, **BERT_BASE) == 16
    assert fitting_micro_batch(32, distill_query, 80, **BERT_BASE) is None          # all of it fits 80 GB
    assert fitting_micro_batch(24, distill_query, 20, **BERT_BASE) == 8             # 12 needs 17.4 of 17 GiB
    with pytest.raises(ConfigError, match=r"stages.distill.micro_batch_size: auto: one example of 3488 tokens .* "
                                          r"more than 85% of this GPU's 1 GiB"):
        fitting_micro_batch(32, distill_query, 1, **BERT_BASE, setting="stages.distill.micro_batch_size")


def test_resolve_replaces_only_auto_and_keeps_one_pass_without_a_gpu():
    auto = TrainingSettings(learning_rate=1e-5, warmup_steps=1, batch_size=64, epochs=1,
                            micro_batch_size="auto")
    resolve = lambda settings, gpu: resolve_micro_batch(settings, 32, 32 + 24 * 144, gpu, **BERT_BASE, setting="s")
    assert resolve(auto, 40).micro_batch_size == 16
    assert resolve(replace(auto, bf16=False), 40).micro_batch_size == 8     # float32 activations: twice the memory
    assert resolve(auto, None).micro_batch_size is None
    fixed = TrainingSettings(learning_rate=1e-5, warmup_steps=1, batch_size=64, epochs=1, micro_batch_size=4)
    assert resolve(fixed, 40) is fixed


@pytest.mark.parametrize("gpu", ["none", "small"])
def test_a_retriever_job_with_auto_runs_the_chunk_its_gpu_holds(tmp_path, monkeypatch, caplog, gpu):
    """train_biencoder with `micro_batch_size: auto`: without a GPU one pass of the 4 queries; on a GPU whose memory
    (made small here) holds 2 queries' pass but not 4, chunks of 2, and the training runs."""
    bert = make_tiny_bert(tmp_path / "bert", dropout=0.0)
    data = write_training_data(tmp_path / "data")
    per_query = 16 + (1 + 3) * 24
    size = model_size(load_text_encoder(str(bert)).transformer)
    small = (pass_gib(2 * per_query, **size) + pass_gib(4 * per_query, **size)) / 2 / USABLE_SHARE
    monkeypatch.setattr("dpr_pipeline.training.biencoder.gpu_memory_gib",
                        lambda device: {"none": None, "small": small}[gpu])
    params = {"plm": str(bert), "learning_rate": 1e-3, "warmup_steps": 1, "batch_size": 4, "epochs": 1, "train_steps": 2,
              "negatives_per_query": 3, "query_max_length": 16, "passage_max_length": 24, "bf16": True,
              "micro_batch_size": "auto"}
    with caplog.at_level(logging.INFO, logger="dpr_pipeline.training.pass_memory"):
        train_biencoder(data / "negatives.parquet", data / "passages.arrow", data / "queries.parquet",
                        tmp_path / "model", tmp_path / "ckpt", tmp_path / "loss.jsonl",
                        BiEncoderSettings.from_params(params, "retriever1"), stage="retriever1")
    expected = {"none": "stages.retriever1.micro_batch_size: auto: one pass (4 examples of 112 tokens",
                "small": "stages.retriever1.micro_batch_size: auto: chunks of 2 (4 examples of 112 tokens"}[gpu]
    assert expected in caplog.text
    assert len((tmp_path / "loss.jsonl").read_text().splitlines()) == 2
