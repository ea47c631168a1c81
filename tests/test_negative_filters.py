"""Positive-aware negative filters (mining.<stage>: relative_margin, absolute_margin, max_score, range_min), each
against hand-computed cases, and the mining job's report of what they dropped."""

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.retrieval.negative_filters import (FILTER_KEYS, NegativeFilters, drop_codes, drop_reason,
                                                     filter_pool, filter_query, reference_score, relative_threshold,
                                                     sample_dropped)
from dpr_pipeline.retrieval.negatives import DROPPED_SAMPLE_SIZE, mine_hard_negatives, write_bm25_negatives

NAN = math.nan


def test_reference_is_the_best_retrieved_positive():
    assert reference_score([0.5, NAN, 0.75]) == 0.75
    assert math.isnan(reference_score([NAN, NAN]))
    assert math.isnan(reference_score([]))


def test_relative_threshold_follows_sentence_transformers():
    assert relative_threshold(20.0, 0.05) == 19.0                 # BM25 scale: 20 x (1 - 0.05)
    assert relative_threshold(0.8, 0.25) == pytest.approx(0.6)    # cosine scale
    assert relative_threshold(-2.0, 0.25) == -2.5                 # a negative positive: still below it


def test_relative_margin_keeps_a_tie_and_drops_just_above():
    f = NegativeFilters(relative_margin=0.25)
    # positive 2.0: threshold 1.5 exactly (2.0 - 2.0 x 0.25)
    kept, dropped = filter_query(["a", "b", "c", "d"], [2.5, 1.5000001, 1.5, 1.0], [1, 2, 4, 5], 2.0, f)
    assert kept == [2, 3]                                         # 1.5 = threshold is kept (score <= threshold)
    assert dropped == [(0, "relative_margin"), (1, "relative_margin")]


def test_absolute_margin_tie_on_bm25_and_cosine_scales():
    bm25 = NegativeFilters(absolute_margin=2.0)
    # positive 20.0: keep scores <= 18.0
    assert filter_query(["a", "b", "c"], [19.0, 18.0, 12.5], [1, 2, 3], 20.0, bm25) == ([1, 2],
                                                                                      [(0, "absolute_margin")])
    cosine = NegativeFilters(absolute_margin=0.25)
    # positive 0.75: keep scores <= 0.5
    assert filter_query(["a", "b", "c"], [0.875, 0.5, 0.25], [1, 2, 3], 0.75, cosine) == ([1, 2],
                                                                                         [(0, "absolute_margin")])
    # the same margin is a different filter on another scale: 0.25 on BM25 scores barely drops anything
    assert filter_query(["a", "b"], [19.875, 19.5], [1, 2], 20.0, cosine) == ([1], [(0, "absolute_margin")])


def test_relative_margin_is_scale_free():
    f = NegativeFilters(relative_margin=0.05)
    # BM25 positive 20 -> threshold 19; cosine positive 0.8 -> 0.76: the same share of the positive
    assert filter_query(["a", "b"], [19.5, 18.0], [1, 2], 20.0, f)[0] == [1]
    assert filter_query(["a", "b"], [0.78, 0.72], [1, 2], 0.8, f)[0] == [1]


def test_max_score_keeps_a_tie():
    f = NegativeFilters(max_score=0.9)
    assert filter_query(["a", "b", "c"], [0.95, 0.9, 0.3], [1, 2, 3], NAN, f) == ([1, 2], [(0, "max_score")])


def test_range_min_skips_the_runs_top_ranks_counting_positives():
    f = NegativeFilters(range_min=2)
    # run: a at rank 1, the positive at rank 2, b at 3: only rank 1 and 2 are skipped, b (rank 3) is kept
    assert filter_query(["a", "b", "c"], [9.0, 7.0, 6.0], [1, 3, 4], 8.0, f) == ([1, 2], [(0, "range_min")])
    assert NegativeFilters(range_min=0).active() == {"range_min": 0}
    assert filter_query(["a"], [9.0], [1], 8.0, NegativeFilters(range_min=0)) == ([0], [])


def test_unretrieved_positive_turns_the_margins_off_but_not_max_score_or_range_min():
    f = NegativeFilters(relative_margin=0.5, absolute_margin=0.0, max_score=10.0, range_min=1)
    assert drop_reason(9.0, 2, NAN, f) is None                   # no reference: the margins cannot apply
    assert drop_reason(11.0, 2, NAN, f) == "max_score"
    assert drop_reason(1.0, 1, NAN, f) == "range_min"
    assert drop_reason(NAN, 2, 5.0, f) is None                   # an unscored candidate (official negatives)


def test_absolute_margin_zero_drops_negatives_above_the_positive_only():
    f = NegativeFilters(absolute_margin=0.0)
    assert drop_reason(8.0, 1, 8.0, f) is None                   # a tie with the positive is kept
    assert drop_reason(8.5, 1, 8.0, f) == "absolute_margin"


def test_first_filter_in_order_is_credited():
    # positive 6.0: absolute threshold 6 - 0.5 = 5.5, relative threshold 6 - 0.6 = 5.4
    f = NegativeFilters(range_min=1, max_score=8.0, absolute_margin=0.5, relative_margin=0.1)
    assert [drop_reason(s, r, 6.0, f) for s, r in [(9.0, 1), (9.0, 2), (5.8, 3), (5.45, 4), (5.4, 5)]] == [
        "range_min", "max_score", "absolute_margin", "relative_margin", None]


@pytest.mark.parametrize("positive", [0.5, -0.25, 20.0, NAN])
def test_the_vectorised_filters_agree_with_drop_reason(positive):
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.choice([0.375, 0.5, 0.625, 18.0, 19.0, 21.0, -0.25, NAN], size=200),
                             rng.normal(0.4, 0.3, 200)])
    ranks = rng.integers(1, 30, size=len(scores))
    for f in [NegativeFilters(relative_margin=0.25), NegativeFilters(absolute_margin=0.125, max_score=0.6),
              NegativeFilters(range_min=5, max_score=19.0, absolute_margin=1.0, relative_margin=0.05)]:
        codes = drop_codes(scores, ranks, positive, f)
        expected = [drop_reason(s, r, positive, f) for s, r in zip(scores, ranks)]
        assert [FILTER_KEYS[c - 1] if c else None for c in codes] == expected


@pytest.mark.parametrize("settings, key", [({"relative_margin": 1.0}, "relative_margin"),
                                           ({"relative_margin": -0.1}, "relative_margin"),
                                           ({"absolute_margin": -1}, "absolute_margin"),
                                           ({"max_score": math.inf}, "max_score"),
                                           ({"range_min": -1}, "range_min"),
                                           ({"range_min": 1.5}, "range_min")])
def test_bad_settings_name_the_key_and_the_fix(settings, key):
    with pytest.raises(ConfigError, match=rf"mining\.retriever1\.{key} = .*Fix: "):
        NegativeFilters.from_settings(settings, "mining.retriever1")


POOL = pd.DataFrame({
    "query_id": ["q1", "q2", "q3"],
    "positive_ids": [["p1"], ["p2", "p3"], ["p4"]],
    "positive_scores": [[10.0], [NAN, 0.5], [NAN]],
    "negative_ids": [["a", "b", "c", "d"], ["e", "f"], ["g", "h"]],
    "negative_scores": [[12.0, 9.5, 9.0, 4.0], [0.6, 0.45], [30.0, 20.0]],
})
RANKS = [[1, 3, 4, 5], [1, 3], [1, 2]]


def test_filter_pool_counts_and_dropped_pairs():
    f = NegativeFilters(relative_margin=0.1)
    pool, counts, dropped = filter_pool(POOL, f, keep=2, ranks=RANKS)
    # q1: threshold 9.0 -> a (12) and b (9.5) dropped, c (9.0, the tie) and d kept
    # q2: reference 0.5 (the retrieved positive), threshold 0.45 -> e dropped, f (0.45, the tie) kept
    # q3: its positive was not retrieved -> the margin cannot apply, both kept
    assert list(pool["negative_ids"]) == [["c", "d"], ["f"], ["g", "h"]]
    assert list(pool["negative_scores"]) == [[9.0, 4.0], [0.45], [30.0, 20.0]]
    assert counts["dropped"] == {"range_min": 0, "max_score": 0, "absolute_margin": 0, "relative_margin": 3,
                                 "denoise": 0}
    assert (counts["candidates"], counts["kept"], counts["dropped_total"]) == (8, 5, 3)
    assert counts["queries_without_positive_score"] == 1 and counts["queries_with_drops"] == 2
    assert (counts["queries_fewer_than_keep_before"], counts["queries_fewer_than_keep"]) == (0, 1)
    assert counts["filters"] == {"relative_margin": 0.1}
    assert list(dropped["doc_id"]) == ["a", "b", "e"]
    assert list(dropped["rank"]) == [1, 3, 1]
    assert list(dropped["positive_score"]) == [10.0, 10.0, 0.5]
    assert list(dropped["threshold"]) == pytest.approx([9.0, 9.0, 0.45])


def test_a_query_left_with_no_negative_is_counted():
    pool, counts, _ = filter_pool(POOL, NegativeFilters(max_score=0.1), keep=1, ranks=RANKS)
    # every score but none is above 0.1: q1, q2 and q3 all emptied
    assert list(pool["negative_ids"]) == [[], [], []]
    assert (counts["queries_without_negatives_before"], counts["queries_without_negatives"]) == (0, 3)
    assert counts["queries_fewer_than_keep"] == 3 and counts["dropped"]["max_score"] == 8


def test_filters_off_drop_nothing_and_keep_the_pool():
    pool, counts, dropped = filter_pool(POOL, NegativeFilters(), keep=2, ranks=RANKS)
    assert list(pool["negative_ids"]) == list(POOL["negative_ids"])
    assert counts["dropped_total"] == 0 and counts["filters"] == {} and dropped.empty
    assert set(counts["dropped"]) == set(FILTER_KEYS)


def test_range_min_without_ranks_counts_list_positions():
    _, counts, dropped = filter_pool(POOL, NegativeFilters(range_min=1), keep=2)
    assert counts["dropped"]["range_min"] == 3 and list(dropped["doc_id"]) == ["a", "e", "g"]


def test_filter_pool_draws_the_same_sample_as_sample_dropped():
    pool = pd.DataFrame({"query_id": [f"q{i}" for i in range(40)], "positive_ids": [["p"]] * 40,
                         "positive_scores": [[1.0]] * 40, "negative_ids": [[f"d{j}" for j in range(10)]] * 40,
                         "negative_scores": [[1.0 - j / 20 for j in range(10)]] * 40})
    f = NegativeFilters(relative_margin=0.2)          # drops the 4 scores above 0.8 of each query: 160 pairs
    _, counts, everything = filter_pool(pool, f, keep=5)
    _, same_counts, sample = filter_pool(pool, f, keep=5, sample_size=12, seed=9)
    assert counts == same_counts and counts["dropped_total"] == 160 and len(everything) == 160
    assert sample.equals(sample_dropped(everything, 12, seed=9)) and len(sample) == 12


def test_dropped_sample_is_seeded_and_ordered():
    dropped = pd.DataFrame({"query_id": [f"q{i % 7}" for i in range(100)], "doc_id": [f"d{i}" for i in range(100)],
                            "rank": list(range(100)), "score": [1.0] * 100, "positive_score": [1.0] * 100,
                            "reason": ["max_score"] * 100, "threshold": [0.5] * 100})
    a, b = sample_dropped(dropped, 10, seed=3), sample_dropped(dropped, 10, seed=3)
    assert len(a) == 10 and a.equals(b) and not a.equals(sample_dropped(dropped, 10, seed=4))
    assert list(a["query_id"]) == sorted(a["query_id"])
    assert len(sample_dropped(dropped.head(4), 10, seed=3)) == 4


def _job_files(tmp_path):
    run = tmp_path / "run_train.trec"
    hits = [("q1", "n1", 1, 12.0), ("q1", "p1", 2, 10.0), ("q1", "n2", 3, 9.5), ("q1", "n3", 4, 9.0),
            ("q1", "n4", 5, 4.0), ("q2", "n1", 1, 3.0), ("q2", "n5", 2, 2.0)]
    run.write_text("".join(f"{q} Q0 {d} {r} {s} x\n" for q, d, r, s in hits))
    pd.DataFrame({"query_id": ["q1", "q2"], "doc_id": ["p1", "p2"], "relevance": pd.array([1, 1], "int32")}).to_parquet(
        tmp_path / "qrels.parquet")
    pd.DataFrame({"query_id": ["q1", "q2"], "text": ["what purrs", "what barks"]}).to_parquet(
        tmp_path / "queries.parquet")
    docs = ["n1", "n2", "n3", "n4", "n5", "p1", "p2"]
    pd.DataFrame({"doc_id": docs, "title": [""] * 7, "text": [f"text of {d}" for d in docs]}).to_parquet(
        tmp_path / "corpus.parquet")
    return {k: str(tmp_path / f) for k, f in [("run", "run_train.trec"), ("qrels", "qrels.parquet"),
                                             ("queries", "queries.parquet"), ("corpus", "corpus.parquet")]}


def test_mining_job_writes_the_filter_report_and_the_dropped_sample(tmp_path):
    files = _job_files(tmp_path)
    report, sample = tmp_path / "negatives_filter.json", tmp_path / "dropped.jsonl"
    mine_hard_negatives(files["run"], files["qrels"], str(tmp_path / "neg.parquet"), depth=100, keep=3, seed=1,
                        source="retriever1", filters=NegativeFilters(relative_margin=0.1), queries=files["queries"],
                        corpus=files["corpus"], filter_report=str(report), dropped_sample=str(sample))
    negatives = read_artifact(tmp_path / "neg.parquet", "negatives").set_index("query_id")
    assert list(negatives.loc["q1", "negative_ids"]) == ["n3", "n4"]   # n1 (12) and n2 (9.5) above 10 x 0.9
    assert list(negatives.loc["q2", "negative_ids"]) == ["n1", "n5"]   # p2 not retrieved: no margin
    counts = json.loads(report.read_text())
    assert counts["dropped"]["relative_margin"] == 2 and counts["queries_without_positive_score"] == 1
    assert counts["queries_fewer_than_keep"] == 2 and counts["sample_size"] == 2
    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    assert rows[0] == {"query_id": "q1", "query": "what purrs", "doc_id": "n1", "passage": "text of n1", "rank": 1,
                       "score": 12.0, "positive_score": 10.0, "reason": "relative_margin", "threshold": 9.0}
    assert [r["doc_id"] for r in rows] == ["n1", "n2"]
    metadata = pq.read_schema(tmp_path / "neg.parquet").metadata
    assert json.loads(metadata[b"dpr_pipeline.filters"]) == {"relative_margin": 0.1}
    assert metadata[b"dpr_pipeline.dropped"] == b"2"


def test_filters_off_report_zero_and_an_empty_sample(tmp_path):
    files = _job_files(tmp_path)
    report, sample = tmp_path / "negatives_filter.json", tmp_path / "dropped.jsonl"
    write_bm25_negatives(files["run"], files["qrels"], str(tmp_path / "neg.parquet"), depth=100, keep=30, seed=0,
                         queries=files["queries"], corpus=files["corpus"], filter_report=str(report),
                         dropped_sample=str(sample))
    counts = json.loads(report.read_text())
    assert counts["filters"] == {} and counts["dropped_total"] == 0 and counts["candidates"] == 6
    assert sample.read_text() == "" and DROPPED_SAMPLE_SIZE == 50
    assert b"dpr_pipeline.filters" not in pq.read_schema(tmp_path / "neg.parquet").metadata
