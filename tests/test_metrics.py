"""Each metric against values computed by hand on a tiny run."""

import hashlib
import json
import math

import pandas as pd
import pytest

from dpr_pipeline.evaluation.metrics import evaluate_run, evaluate_splits, parse_metric

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
    assert list(written) == ["dev", "counts", "per_query", "provenance"]
    # q4 is judged with grade 0 only; q3 gets no hit; the artifact was not written by ingestion (no metadata)
    assert written["counts"]["dev"] == {"queries_scored": 3, "queries_without_hits": 1,
                                        "judgements_naming_unknown_documents": None,
                                        "judged_queries_without_relevant": 1, "queries_dropped_at_ingestion": None}
    provenance = written["provenance"]
    assert provenance["manifest"] == "results/x/bm25/manifest.json"
    assert provenance["runs"]["dev"]["sha256"] == hashlib.sha256(run_file.read_bytes()).hexdigest()
    assert provenance["qrels"]["dev"]["path"] == str(tmp_path / "qrels.parquet")
    assert written["dev"]["num_queries"] == 3
    assert written["dev"]["R@50"] == pytest.approx(2 / 3)
    # each judged query's value, what two stages are compared by: q1 1/2 at rank 2, q2 beyond 10, q3 no hit
    assert written["per_query"]["dev"] == {"MRR@10": {"q1": 0.5, "q2": 0.0, "q3": 0.0},
                                           "R@50": {"q1": 1.0, "q2": 1.0, "q3": 0.0}}


def test_arguana_shaped_split_keeps_every_judged_query_as_trec_eval_and_beir_do(tmp_path):
    """ArguAna's shape: queries are corpus documents (ignore_identical_ids), and some test judgements name
    documents missing from the corpus (5 in the real BEIR ArguAna), kept under unknown_qrels_ids: warn."""
    from conftest import write_beir

    from dpr_pipeline.data.ingest import ingest_corpus, ingest_split

    arguments = [(f"q{i}", "", f"argument {i}") for i in range(1, 6)]
    counters = [(f"c{i}", "", f"counter-argument {i}") for i in range(1, 5)] + [("f1", "", "filler")]
    queries = [(f"q{i}", f"argument {i}") for i in range(1, 6)]
    qrels = {"test": [("q1", "c1", 1),
                      ("q2", "c2", 1), ("q2", "c404", 1),   # one of q2's two relevant documents is not in the corpus
                      ("q3", "c405", 1),                    # q3's only relevant document is not in the corpus
                      ("q4", "c4", 1),                      # q4: the run has no hit for it
                      ("q5", "c1", 0),                      # q5: judged, nothing relevant: not scored
                      ("q99", "c1", 1)]}                    # q99: not in the queries file: dropped, counted
    root = write_beir(tmp_path / "raw", docs=arguments + counters, queries=queries, qrels=qrels)
    ingest_corpus("beir", root, tmp_path / "corpus.parquet")
    ingest_split("beir", root, "test", tmp_path / "corpus.parquet", tmp_path / "queries_test.parquet",
                 tmp_path / "qrels_test.parquet", unknown_qrels_ids="warn", evaluation=True)
    assert set(pd.read_parquet(tmp_path / "queries_test.parquet")["query_id"]) == {"q1", "q2", "q3", "q4", "q5"}
    run = tmp_path / "run_test.trec"   # each query retrieves itself first (dropped by ignore_identical_ids)
    run.write_text("q1 Q0 q1 1 10 t\nq1 Q0 f1 2 9 t\nq1 Q0 c1 3 8 t\n"      # c1 at rank 2 once q1 is dropped
                   "q2 Q0 q2 1 10 t\nq2 Q0 c2 2 9 t\nq2 Q0 f1 3 8 t\n"      # c2 at rank 1, c404 never
                   "q3 Q0 q3 1 10 t\nq3 Q0 c3 2 9 t\nq3 Q0 f1 3 8 t\n")     # nothing relevant retrievable
    result = evaluate_splits([str(run)], [str(tmp_path / "qrels_test.parquet")], ["test"],
                             ["MRR@10", "R@10", "nDCG@10"], str(tmp_path / "metrics.json"), ignore_identical_ids=True)
    # by hand, over the 4 queries with a relevant judgement (q1, q2, q3, q4):
    # RR: q1 1/2, q2 1, q3 0, q4 0.  R@10: q1 1/1, q2 1/2 (c404 counts in the denominator), q3 0, q4 0.
    # nDCG@10: q1 (1/log2 3) / 1; q2 1 / (1 + 1/log2 3) (ideal ranking has c2 and c404); q3 0; q4 0.
    ndcg_q1, ndcg_q2 = 1 / math.log2(3), 1 / (1 + 1 / math.log2(3))
    assert result["test"]["num_queries"] == 4
    assert result["test"]["MRR@10"] == pytest.approx((0.5 + 1) / 4)
    assert result["test"]["R@10"] == pytest.approx((1 + 0.5) / 4)
    assert result["test"]["nDCG@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 4)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["counts"]["test"] == {"queries_scored": 4, "queries_without_hits": 1,
                                         "judgements_naming_unknown_documents": 2,
                                         "judged_queries_without_relevant": 1,
                                         "queries_dropped_at_ingestion": {"not in the queries file": 1}}
