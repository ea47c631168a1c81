"""Negatives from a run: positives removed, depth respected, sampling reproducible per query."""

import math

import pandas as pd

from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.retrieval.negatives import negatives_from_run, sample_negatives, write_bm25_negatives

QRELS = pd.DataFrame([("q1", "p1", 1), ("q1", "p2", 1), ("q2", "p3", 1), ("q3", "x", 0), ("q4", "p4", 1)],
                     columns=["query_id", "doc_id", "relevance"])
RUN = pd.DataFrame([("q1", "n1", 1, 9.0), ("q1", "p1", 2, 8.0), ("q1", "n2", 3, 7.0), ("q1", "n3", 4, 6.0),
                    ("q2", "n1", 1, 5.0), ("q2", "n9", 2, 4.0), ("q3", "n1", 1, 1.0)],
                   columns=["query_id", "doc_id", "rank", "score"])


def test_pool_is_top_depth_minus_positives():
    pool = negatives_from_run(RUN, QRELS, depth=3).set_index("query_id")
    assert list(pool.index) == ["q1", "q2", "q4"]              # q3 has no positive judgement
    assert pool.loc["q1", "negative_ids"] == ["n1", "n2"]      # p1 removed, n3 is below depth 3
    assert pool.loc["q1", "negative_scores"] == [9.0, 7.0]
    assert pool.loc["q1", "positive_scores"][0] == 8.0 and math.isnan(pool.loc["q1", "positive_scores"][1])
    assert pool.loc["q4", "negative_ids"] == []                 # judged but not retrieved


def test_sampling_is_seeded_per_query_and_keeps_rank_order():
    pool = pd.DataFrame({"query_id": ["a", "b"], "positive_ids": [["p"], ["p"]], "positive_scores": [[1.0], [1.0]],
                         "negative_ids": [[f"n{i}" for i in range(50)]] * 2,
                         "negative_scores": [[float(-i) for i in range(50)]] * 2})
    first = sample_negatives(pool, keep=5, seed=7)
    again = sample_negatives(pool.iloc[::-1].reset_index(drop=True), keep=5, seed=7).set_index("query_id")
    for _, row in first.iterrows():
        assert len(row.negative_ids) == 5
        assert row.negative_ids == again.loc[row.query_id, "negative_ids"]          # order of queries irrelevant
        assert row.negative_scores == sorted(row.negative_scores, reverse=True)     # still in rank order
    assert first.loc[0, "negative_ids"] != first.loc[1, "negative_ids"]               # each query its own draw
    assert sample_negatives(pool, keep=5, seed=8).loc[0, "negative_ids"] != first.loc[0, "negative_ids"]
    assert sample_negatives(pool, keep=100, seed=7).loc[0, "negative_ids"] == pool.loc[0, "negative_ids"]


def test_write_bm25_negatives_from_a_trec_run(tmp_path):
    run_file = tmp_path / "run_train.trec"
    run_file.write_text("".join(f"{q} Q0 {d} {r} {s} bm25\n" for q, d, r, s in RUN.itertuples(index=False)))
    QRELS.assign(relevance=QRELS["relevance"].astype("int32")).to_parquet(tmp_path / "qrels.parquet")
    write_bm25_negatives(str(run_file), str(tmp_path / "qrels.parquet"), str(tmp_path / "neg.parquet"),
                         depth=200, keep=1, seed=0)
    frame = read_artifact(tmp_path / "neg.parquet", "negatives").set_index("query_id")
    assert len(frame.loc["q1", "negative_ids"]) == 1 and frame.loc["q1", "negative_ids"][0] in {"n1", "n2", "n3"}
