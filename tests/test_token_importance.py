"""CDMAE token-importance-aware masking: n-gram counts, PMI (Eq. 7), AMI (Eq. 8) and Algorithm 1."""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from dpr_pipeline.pretraining.token_importance import (
    NgramCounts,
    ami_importance,
    count_ngrams,
    importance_aware_mask,
    pmi,
)

# Unigrams 1:3 2:3 3:1 4:1 5:1 (9); bigrams 12:3 23:1 24:1 51:1 (6); trigrams 123 124 512 (3).
TOY = [np.array([1, 2, 3]), np.array([1, 2, 4]), np.array([5, 1, 2])]
PMI_12 = math.log(3 / 6) - math.log(3 / 9) - math.log(3 / 9)
PMI_23 = math.log(1 / 6) - math.log(3 / 9) - math.log(1 / 9)
PMI_123 = math.log(1 / 3) - math.log(3 / 9) - math.log(3 / 9) - math.log(1 / 9)
PMI_512 = math.log(1 / 3) - math.log(1 / 9) - math.log(3 / 9) - math.log(3 / 9)
CLS, SEP, PAD = 0, 6, 7


def assert_same_counts(a: NgramCounts, b: NgramCounts) -> None:
    assert (a.vocab_size, a.max_n, a.min_count) == (b.vocab_size, b.max_n, b.min_count)
    np.testing.assert_array_equal(a.totals, b.totals)
    for n in range(a.max_n):
        np.testing.assert_array_equal(a.keys[n], b.keys[n])
        np.testing.assert_array_equal(a.counts[n], b.counts[n])


def random_corpus(seed: int, size: int = 200) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 20, rng.integers(0, 12)).astype(np.uint16) for _ in range(size)]


def test_counts_match_a_python_count_within_sequences():
    corpus = random_corpus(0)
    counts = count_ngrams(corpus, vocab_size=20, max_n=3, min_count=1, chunk_tokens=7)
    for n in range(1, 4):
        reference = Counter(tuple(s[i:i + n]) for s in corpus for i in range(len(s) - n + 1))
        table = dict(zip(counts.keys[n - 1].tolist(), counts.counts[n - 1].tolist()))
        assert table == {int(counts.pack(np.array(g))): c for g, c in reference.items()}
        assert counts.totals[n - 1] == sum(reference.values())


def test_ngrams_do_not_cross_sequences():
    counts = count_ngrams([np.array([1, 2]), np.array([3, 4])], vocab_size=8, max_n=3, min_count=1)
    assert counts.totals.tolist() == [4, 2, 0]
    assert counts.keys[1].tolist() == sorted(counts.pack(np.array([[1, 2], [3, 4]])).tolist())
    assert counts.keys[2].size == 0


def test_pmi_by_hand():
    counts = count_ngrams(TOY, vocab_size=8, max_n=3, min_count=1)
    got = pmi(counts, np.array([[1, 2], [2, 3]]))
    np.testing.assert_allclose(got, [PMI_12, PMI_23])
    np.testing.assert_allclose(pmi(counts, np.array([[1, 2, 3], [5, 1, 2]])), [PMI_123, PMI_512])


def test_pruned_ngrams_are_looked_up_as_one():
    full = count_ngrams(TOY, vocab_size=8, max_n=3, min_count=1)
    pruned = count_ngrams(TOY, vocab_size=8, max_n=3)  # min_count=2
    assert pruned.keys[0].size == 5 and pruned.keys[1].size == 1 and pruned.keys[2].size == 0
    np.testing.assert_array_equal(pruned.totals, full.totals)
    grams = np.array([[1, 2], [2, 3], [5, 1], [3, 5]])  # the last never occurs
    assert pruned.count(2, pruned.pack(grams)).tolist() == [3, 1, 1, 1]
    np.testing.assert_allclose(pmi(pruned, np.array([[1, 2, 3], [5, 1, 2]])), [PMI_123, PMI_512])
    assert_same_counts(full.pruned(2), pruned)


def test_merged_shards_equal_counting_everything():
    corpus = random_corpus(1)
    shards = [count_ngrams(corpus[:70], vocab_size=20, max_n=4, min_count=1),
              count_ngrams(corpus[70:], vocab_size=20, max_n=4, min_count=1)]
    merged = NgramCounts.merge(shards)
    assert_same_counts(merged, count_ngrams(corpus, vocab_size=20, max_n=4, min_count=1))
    assert_same_counts(merged.pruned(2), count_ngrams(corpus, vocab_size=20, max_n=4))


def test_save_load_round_trip(tmp_path):
    counts = count_ngrams(random_corpus(2), vocab_size=20, max_n=4)
    counts.save(tmp_path / "ngrams.npz")
    assert_same_counts(NgramCounts.load(tmp_path / "ngrams.npz"), counts)


def test_keys_must_fit_in_int64():
    count_ngrams([], vocab_size=30522, max_n=4)  # 15 bits × 4 = 60
    with pytest.raises(ValueError, match=r"vocab_size 65537 .*max_n=4"):
        count_ngrams([], vocab_size=65537, max_n=4)  # 17 bits × 4 = 68
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 8\)"):
        count_ngrams([np.array([1, 8])], vocab_size=8, max_n=2)


def test_ami_by_hand_with_special_tokens_and_padding():
    counts = count_ngrams(TOY, vocab_size=8, max_n=3, min_count=1)
    ids = np.array([[1, 2, 3, PAD, PAD, PAD],
                    [CLS, 1, 2, SEP, 3, SEP]])  # second row: [1, 2] and [3] are separate spans
    valid = np.array([[True, True, True, False, False, False],
                      [False, True, True, False, True, False]])
    ami = ami_importance(ids, valid, counts, window=3)
    assert ami.dtype == np.float32
    expected = [[(PMI_12 + PMI_123) / 2,              # right side only: 12, 123
                 PMI_12 + PMI_23,                     # left 12, right 23 (both 3-grams leave the span)
                 (PMI_23 + PMI_123) / 2, 0, 0, 0],    # left side only: 23, 123
                [0, PMI_12, PMI_12, 0, 0, 0]]         # the lone 3 has no n-gram on either side
    np.testing.assert_allclose(ami, expected, rtol=1e-6)


def test_ami_window_needs_counts():
    counts = count_ngrams(TOY, vocab_size=8, max_n=3)
    with pytest.raises(ValueError, match="window 4"):
        ami_importance(np.array([[1, 2]]), np.ones((1, 2), bool), counts)


def test_mask_count_per_row_and_only_eligible():
    generator = torch.Generator().manual_seed(0)
    importance = torch.randn(8, 40, generator=generator)
    eligible = torch.rand(8, 40, generator=generator) < 0.7
    eligible[0] = False
    eligible[1] = True
    mask = importance_aware_mask(importance, eligible, rate=0.3, generator=generator)
    assert mask.dtype == torch.bool
    assert not (mask & ~eligible).any()
    assert mask.sum(1).tolist() == [math.floor(n * 0.3) for n in eligible.sum(1).tolist()]


def test_without_noise_masks_the_top_k():
    generator = torch.Generator().manual_seed(1)
    importance = torch.stack([torch.randperm(20, generator=generator).float() for _ in range(5)])
    eligible = torch.rand(5, 20, generator=generator) < 0.6
    mask = importance_aware_mask(importance, eligible, rate=0.5, sigma=0.0)
    for row in range(5):
        values = sorted(importance[row][eligible[row]].tolist(), reverse=True)
        top = set(values[:math.floor(len(values) * 0.5)])
        assert mask[row].tolist() == [bool(e) and v in top for v, e in zip(importance[row].tolist(), eligible[row])]


def test_high_ami_tokens_are_masked_more_often_than_uniform():
    rng = np.random.default_rng(3)
    collocation = [3, 4, 5]  # background tokens are 10 … 17

    def passage(at: int) -> np.ndarray:
        return np.insert(rng.integers(10, 18, 20), at, collocation)

    counts = count_ngrams([passage(rng.integers(0, 21)) for _ in range(2000)], vocab_size=32, max_n=4)
    content = passage(10)
    ids = np.concatenate([[CLS], content, [SEP], [PAD] * 4])[None]
    valid = np.zeros(ids.shape, bool)
    valid[0, 1:1 + content.size] = True
    ami = ami_importance(ids, valid, counts)[0]
    rate, draws = 0.3, 4000
    mask = importance_aware_mask(torch.from_numpy(ami).repeat(draws, 1), torch.from_numpy(valid).repeat(draws, 1),
                                 rate=rate, generator=torch.Generator().manual_seed(0))
    frequency = mask.float().mean(0).numpy()
    at = 1 + 10 + np.arange(3)
    assert (frequency[at] > 2 * rate).all()
    low = valid[0] & (ami < np.median(ami[valid[0]]))
    assert frequency[low].mean() < rate / 2
    assert (frequency[~valid[0]] == 0).all()
