"""Bad input: one clear DataError naming the file, the line/row and the fix, and no partial output."""

import json

import pandas as pd
import pytest
from conftest import DOCS, QRELS, QUERIES, write_beir, write_msmarco

from dpr_pipeline.data.ingest import ingest_corpus, ingest_split, read_ingestion_counts
from dpr_pipeline.errors import DataError


def corpus_error(fmt, root, tmp_path):
    out = tmp_path / "out" / "corpus.parquet"
    with pytest.raises(DataError) as caught:
        ingest_corpus(fmt, root, out)
    assert not out.exists() and not any(p.name != "out" for p in out.parent.iterdir()), "partial output left"
    assert "Fix:" in str(caught.value)
    return caught.value


def split_error(fmt, root, tmp_path, split="train", **kwargs):
    corpus = tmp_path / "corpus.parquet"
    if not corpus.exists():
        ingest_corpus(fmt, root, corpus)
    queries, qrels = tmp_path / "out" / "q.parquet", tmp_path / "out" / "qrels.parquet"
    with pytest.raises(DataError) as caught:
        ingest_split(fmt, root, split, corpus, queries, qrels, **kwargs)
    assert not queries.exists() and not qrels.exists(), "partial output left"
    assert "Fix:" in str(caught.value)
    return caught.value


def test_missing_file(tmp_path):
    (tmp_path / "raw").mkdir()
    err = corpus_error("beir", tmp_path / "raw", tmp_path)
    assert "corpus.jsonl" in str(err) and "not found" in str(err)


def test_missing_json_field(tmp_path):
    root = write_beir(tmp_path / "raw")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n{"_id": "d2", "title": "no text"}\n')
    err = corpus_error("beir", root, tmp_path)
    assert err.line == 2 and "'text'" in str(err) and "corpus.jsonl, line 2" in str(err)


def test_missing_parquet_column(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    pd.DataFrame({"doc_id": ["a"], "body": ["x"]}).to_parquet(root / "corpus.parquet")
    err = corpus_error("parquet", root, tmp_path)
    assert "missing column(s) 'text'" in str(err) and "corpus.parquet" in str(err)


def test_empty_doc_id(tmp_path):
    root = write_beir(tmp_path / "raw", docs=[("d1", "", "text"), (" ", "", "text")])
    err = corpus_error("beir", root, tmp_path)
    assert err.line == 2 and "empty document id" in str(err)


def test_duplicate_doc_id(tmp_path):
    root = write_beir(tmp_path / "raw", docs=DOCS + [("d2", "", "again")])
    err = corpus_error("beir", root, tmp_path)
    assert err.line == 5 and "duplicate document id 'd2'" in str(err)


def test_empty_text(tmp_path):
    root = write_beir(tmp_path / "raw", docs=[("d1", "", "text"), ("d2", "", "  ")])
    err = corpus_error("beir", root, tmp_path)
    assert err.line == 2 and "empty text" in str(err)


def test_empty_query_text(tmp_path):
    root = write_beir(tmp_path / "raw", queries=[("q1", ""), ("q2", "dogs")])
    err = split_error("beir", root, tmp_path)
    assert err.line == 1 and "query 'q1' has empty text" in str(err)


def test_bad_json_line(tmp_path):
    root = write_beir(tmp_path / "raw")
    with open(root / "corpus.jsonl", "a") as out:
        out.write('{"_id": "d9", "text": "unterminated\n')
    err = corpus_error("beir", root, tmp_path)
    assert err.line == 5 and "not valid JSON (Unterminated string starting at column" in str(err)


def test_wrong_column_count(tmp_path):
    root = write_msmarco(tmp_path / "raw")
    (root / "collection.tsv").write_text("p1\tfine\np2\tone tab\ttoo many\n")
    err = corpus_error("msmarco", root, tmp_path)
    assert err.line == 2 and "3 tab-separated columns, expected 2" in str(err)


def test_wrong_qrels_column_count(tmp_path):
    root = write_msmarco(tmp_path / "raw")
    (root / "qrels.train.tsv").write_text("q1 0 d1 1\nq2 d2 1\n")
    err = split_error("msmarco", root, tmp_path)
    assert err.line == 2 and "expected 4" in str(err)


def test_non_utf8_bytes(tmp_path):
    root = write_beir(tmp_path / "raw")
    with open(root / "corpus.jsonl", "ab") as out:
        out.write(json.dumps({"_id": "d9", "text": "caf"}).encode()[:-2] + b"\xe9\"}\n")
    err = corpus_error("beir", root, tmp_path)
    assert err.line == 5 and "not UTF-8" in str(err)


def test_non_integer_relevance(tmp_path):
    root = write_beir(tmp_path / "raw", qrels={"train": [("q1", "d1", "high")]})
    err = split_error("beir", root, tmp_path)
    assert err.line == 2 and "relevance 'high'" in str(err)


def test_unknown_query_in_qrels_is_an_error(tmp_path):
    root = write_beir(tmp_path / "raw", qrels={"train": QRELS["train"] + [("q99", "d1", 1)]})
    err = split_error("beir", root, tmp_path)
    assert err.line == 4 and "query id 'q99'" in str(err) and "unknown_qrels_ids: warn" in str(err)
    # the judgement's file is the error's location; the message names the queries file that lacks the id
    assert err.path == str(root / "qrels" / "train.tsv")
    assert f"is not in the queries file {root / 'queries.jsonl'} (1 of 1" in str(err)


def test_unknown_document_in_qrels_is_an_error(tmp_path):
    root = write_beir(tmp_path / "raw", qrels={"train": [("q1", "d404", 1)] + QRELS["train"]})
    err = split_error("beir", root, tmp_path)
    assert err.line == 2 and f"doc id 'd404' is not in the corpus ({root / 'corpus.jsonl'})" in str(err)
    assert err.path == str(root / "qrels" / "train.tsv")


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


def test_split_without_judgements(tmp_path):
    root = write_beir(tmp_path / "raw", qrels={"train": []})
    err = split_error("beir", root, tmp_path)
    assert "split 'train' has no judgements" in str(err)
    assert err.path == str(root / "qrels" / "train.tsv")      # the empty file, not the dataset's folder


def test_duplicate_query_id(tmp_path):
    root = write_beir(tmp_path / "raw", queries=QUERIES + [("q1", "again")])
    err = split_error("beir", root, tmp_path)
    assert err.line == 5 and "duplicate query id 'q1'" in str(err)


def test_repeated_judgement(tmp_path):
    root = write_beir(tmp_path / "raw", qrels={"train": QRELS["train"] + [("q1", "d1", 0)]})
    err = split_error("beir", root, tmp_path)
    assert err.line == 4 and "repeated judgement" in str(err)


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
