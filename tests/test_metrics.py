"""Each metric against values computed by hand on a tiny run."""

import hashlib
import json
import math

import pandas as pd
import pytest

from dpr_pipeline.metrics import evaluate_run, evaluate_splits, parse_metric

QRELS = pd.DataFrame([("q1", "d1", 1), ("q1", "d2", 2), ("q1", "d5", 0), ("q2", "d3", 1), ("q3", "d4", 1),
                      ("q4", "d1", 0)], columns=["query_id", "doc_id", "relevance"])
# q1: relevant at ranks 2 (grade 1) and 4 (grade 2); q2: its only relevant document at rank 12;
# q3: not in the run (counts as 0); q4: no relevant judgement (not counted).
RUN = pd.DataFrame(
    [("q1", "dA", 1, 3.0), ("q1", "d1", 2, 2.0), ("q1", "dB", 3, 1.0), ("q1", "d2", 4, 0.5)]
    + [("q2", f"n{i}", i, 20.0 - i) for i in range(1, 12)] + [("q2", "d3", 12, 1.0)],
    columns=["query_id", "doc_id", "rank", "score"])


def test_mrr_at_10_uses_the_cutoff_and_counts_unanswered_queries():
    # q1: 1/2; q2: first relevant at rank 12 > 10 -> 0; q3: 0. Mean over 3 judged queries.
    result = evaluate_run(RUN, QRELS, ["MRR@10", "RR@10"])
    assert result["num_queries"] == 3
    assert result["MRR@10"] == pytest.approx(0.5 / 3)
    assert result["RR@10"] == pytest.approx(0.5 / 3)


def test_recall_at_cutoffs():
    result = evaluate_run(RUN, QRELS, ["R@3", "R@50", "R@1000"])
    assert result["R@3"] == pytest.approx((1 / 2 + 0 + 0) / 3)   # q1 finds d1 only in its top 3
    assert result["R@50"] == pytest.approx((1 + 1 + 0) / 3)
    assert result["R@1000"] == pytest.approx((1 + 1 + 0) / 3)


def test_ndcg_at_10_with_graded_relevance():
    dcg = 1 / math.log2(2 + 1) + 2 / math.log2(4 + 1)            # grades 1 and 2 at ranks 2 and 4
    ideal = 2 / math.log2(1 + 1) + 1 / math.log2(2 + 1)          # grade 2 first, then grade 1
    result = evaluate_run(RUN, QRELS, ["nDCG@10"])
    assert result["nDCG@10"] == pytest.approx((dcg / ideal + 0 + 0) / 3)


def test_order_comes_from_scores_not_file_order():
    shuffled = RUN.sample(frac=1.0, random_state=0)
    assert evaluate_run(shuffled, QRELS, ["MRR@10"]) == evaluate_run(RUN, QRELS, ["MRR@10"])


def test_unknown_metric_is_rejected_by_name():
    with pytest.raises(ValueError, match="unknown metric 'bogus@3'"):
        parse_metric("bogus@3")


def test_evaluate_splits_writes_one_object_per_split(tmp_path):
    run_file = tmp_path / "run.trec"
    run_file.write_text("".join(f"{q} Q0 {d} {r} {s} t\n" for q, d, r, s in RUN.itertuples(index=False)))
    QRELS.assign(relevance=QRELS["relevance"].astype("int32")).to_parquet(tmp_path / "qrels.parquet")
    evaluate_splits([str(run_file)], [str(tmp_path / "qrels.parquet")], ["dev"], ["MRR@10", "R@50"],
                    str(tmp_path / "metrics.json"), manifest="results/x/bm25/manifest.json")
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert list(written) == ["dev", "provenance"]
    provenance = written["provenance"]
    assert provenance["manifest"] == "results/x/bm25/manifest.json"
    assert provenance["runs"]["dev"]["sha256"] == hashlib.sha256(run_file.read_bytes()).hexdigest()
    assert provenance["qrels"]["dev"]["path"] == str(tmp_path / "qrels.parquet")
    assert written["dev"]["num_queries"] == 3
    assert written["dev"]["R@50"] == pytest.approx(2 / 3)
