"""Ingestion of dubious input that is not an error: dropped or skipped rows, counted and logged (the errors it
raises: tests/test_bad_inputs.py)."""


import pandas as pd
import pytest
from conftest import QRELS, QUERIES, write_beir

from dpr_pipeline.data.ingest import ingest_corpus, ingest_split, read_ingestion_counts
from dpr_pipeline.errors import DataError


def test_unknown_ids_can_be_dropped_with_a_counted_warning(tmp_path, caplog):
    rows = QRELS["train"] + [("q99", "d1", 1), ("q1", "d404", 1), ("q2", "d405", 1)]
    root = write_beir(tmp_path / "raw", qrels={"train": rows})
    corpus = tmp_path / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    queries, judgements = ingest_split("beir", root, "train", corpus, tmp_path / "q.parquet",
                                       tmp_path / "r.parquet", unknown_qrels_ids="warn")
    assert (queries, judgements) == (2, 2)
    assert "dropped 1 judgement(s) whose query id" in caplog.text
    assert "dropped 2 judgement(s) whose doc id" in caplog.text


def test_empty_documents_are_skipped_and_counted_when_asked(tmp_path, caplog):
    docs = [("d1", "", "text"), ("d2", "", "  "), ("d3", "Title only", ""), ("d4", "", "")]
    root = write_beir(tmp_path / "raw", docs=docs)
    out = tmp_path / "corpus.parquet"
    assert ingest_corpus("beir", root, out, skip_empty_documents=True) == 2
    assert list(pd.read_parquet(out)["doc_id"]) == ["d1", "d3"]            # a title alone is not empty
    assert "skipped 2 empty document(s)" in caplog.text and "first: 'd2'" in caplog.text
    assert "line/row 2" in caplog.text
    with pytest.raises(DataError, match="skip_empty_documents: true"):      # off by default
        ingest_corpus("beir", root, tmp_path / "again.parquet")


def arguana_like(tmp_path):
    """Test judgements as in the real ArguAna and MS MARCO: one names a document the corpus lacks (q2's only
    one), one names a query the queries file lacks (q99), one query has only a grade-0 judgement (q3)."""
    qrels = {"test": [("q1", "d1", 1), ("q2", "d404", 1), ("q3", "d3", 0), ("q99", "d1", 1)]}
    root = write_beir(tmp_path / "raw", qrels=qrels)
    corpus = tmp_path / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    return root, corpus


def test_an_evaluation_split_keeps_judgements_of_unknown_documents_and_reports_dropped_queries(tmp_path, caplog):
    import pyarrow.parquet as pq

    root, corpus = arguana_like(tmp_path)
    queries, qrels = tmp_path / "queries_test.parquet", tmp_path / "qrels_test.parquet"
    assert ingest_split("beir", root, "test", corpus, queries, qrels, unknown_qrels_ids="warn",
                        evaluation=True) == (3, 3)
    assert list(pd.read_parquet(queries)["query_id"]) == ["q1", "q2", "q3"]   # q2 stays: it scores 0
    assert ("q2", "d404") in set(zip(*pd.read_parquet(qrels)[["query_id", "doc_id"]].T.values))
    assert pq.read_schema(qrels).metadata[b"dpr_pipeline.unknown_documents"] == b"1"
    assert read_ingestion_counts(qrels) == {"queries": 3, "judgements": 3,
                                            "queries_dropped": {"not in the queries file": 1},
                                            "queries_without_positive": 1, "positive_grade": 1,
                                            "judgements_naming_unknown_documents": 1}
    assert "split test: dropped 1 query: not in the queries file (first 'q99')" in caplog.text
    assert "split test: 1 query kept without a judgement of grade >= 1 (first 'q3')" in caplog.text
    assert "kept 1 judgement(s) naming documents not in the corpus" in caplog.text


def test_a_train_split_drops_queries_whose_judgements_name_only_unknown_documents(tmp_path, caplog):
    root, corpus = arguana_like(tmp_path)
    queries, qrels = tmp_path / "queries_test.parquet", tmp_path / "qrels_test.parquet"
    assert ingest_split("beir", root, "test", corpus, queries, qrels, unknown_qrels_ids="warn",
                        min_relevance=1) == (2, 2)
    assert list(pd.read_parquet(queries)["query_id"]) == ["q1", "q3"]
    assert "dropped 1 query: every judgement names a document not in the corpus (first 'q2')" in caplog.text
    assert "not trained on (min_relevance)" in caplog.text
    assert read_ingestion_counts(qrels)["queries_dropped"] == {
        "not in the queries file": 1, "every judgement names a document not in the corpus": 1}


def test_listed_overlap_is_kept_with_a_counted_warning(tmp_path, caplog):
    queries = QUERIES + [("q5", "why do cats purr")]                     # SciFact-like: a claim in both splits
    root = write_beir(tmp_path / "raw", queries=queries, qrels={**QRELS, "test": [("q3", "d3", 1), ("q5", "d1", 1)]})
    corpus, train = tmp_path / "corpus.parquet", tmp_path / "queries_train.parquet"
    ingest_corpus("beir", root, corpus)
    ingest_split("beir", root, "train", corpus, train, tmp_path / "qrels_train.parquet")
    out = tmp_path / "queries_test.parquet", tmp_path / "qrels_test.parquet"
    assert ingest_split("beir", root, "test", corpus, *out, evaluation=True, train_queries=train,
                        allow_overlap=["q5"]) == (2, 2)
    assert "1 of the 2 queries of evaluation split 'test' are also train queries" in caplog.text
    assert "kept because allow_overlap lists them" in caplog.text
