"""Pyserini BM25 on a tiny corpus: indexing, both field choices, --remove-query behaviour."""

import logging

import pandas as pd
import pytest

from conftest import write_beir
from dpr_pipeline.bm25 import build_index, search
from dpr_pipeline.data.ingest import ingest_corpus, ingest_split
from dpr_pipeline.runs import read_trec_run

pytestmark = pytest.mark.slow

DOCS = [("q1", "", "cats purr, cats purr"),  # a document whose id equals a query id
        ("d1", "Cats", "why do cats purr? cats purr when content"),
        ("d2", "Dogs", "dogs bark"), ("d3", "Purr machines", "a purr is a low sound")]
QUERIES = [("q1", "why do cats purr"), ("q2", "dogs")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bm25")
    root = write_beir(tmp / "raw", docs=DOCS, queries=QUERIES, qrels={"test": [("q1", "d1", 1), ("q2", "d2", 1)]})
    ingest_corpus("beir", root, tmp / "corpus.parquet")
    ingest_split("beir", root, "test", tmp / "corpus.parquet", tmp / "queries.parquet", tmp / "qrels.parquet")
    for fields in ("flat", "multifield"):
        build_index(tmp / "corpus.parquet", tmp / f"index-{fields}", fields=fields)
    return tmp


@pytest.mark.parametrize("fields", ["flat", "multifield"])
def test_search_ranks_the_matching_document_first(tiny, fields):
    assert search(tiny / f"index-{fields}", tiny / "queries.parquet", tiny / "run.trec", k=3, fields=fields) == 2
    run = read_trec_run(tiny / "run.trec")
    top = run[run["rank"] == 1].set_index("query_id")["doc_id"].to_dict()
    assert top == {"q1": "d1", "q2": "d2"}
    assert run.groupby("query_id").size().max() <= 3
    assert (run.groupby("query_id")["score"].apply(lambda s: s.is_monotonic_decreasing)).all()


def test_title_is_searchable_in_flat_index(tiny):
    """'machines' only occurs in d3's title, so the title must have been indexed with the text."""
    pd.DataFrame({"query_id": ["t"], "text": ["machines"]}).to_parquet(tiny / "q.parquet")
    search(tiny / "index-flat", tiny / "q.parquet", tiny / "t.trec", k=5)
    assert read_trec_run(tiny / "t.trec")["doc_id"].tolist() == ["d3"]


def test_remove_query_id_hits_keeps_k_hits(tiny):
    search(tiny / "index-flat", tiny / "queries.parquet", tiny / "keep.trec", k=2)
    search(tiny / "index-flat", tiny / "queries.parquet", tiny / "drop.trec", k=2, remove_query_id_hits=True)
    keep, drop = read_trec_run(tiny / "keep.trec"), read_trec_run(tiny / "drop.trec")
    assert "q1" in keep[keep.query_id == "q1"]["doc_id"].tolist()
    q1 = drop[drop.query_id == "q1"]["doc_id"].tolist()
    assert "q1" not in q1 and len(q1) == 2


def test_index_holds_every_document(tiny):
    from pyserini.index.lucene import IndexReader

    assert IndexReader(str(tiny / "index-flat")).stats()["documents"] == len(DOCS)


def test_a_query_over_lucenes_clause_limit_is_searched_in_full_and_counted(tiny, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dpr_pipeline")
    # 1,500 distinct terms: over Lucene's default 1,024 clauses (such a query used to get no hits at all)
    long = "cats purr " + " ".join(f"term{i}" for i in range(1500))
    queries = tmp_path / "queries.parquet"
    pd.DataFrame({"query_id": ["long", "q2", "nohit"], "text": [long, "dogs", "xyzzy"]}).to_parquet(queries)
    for fields in ("flat", "multifield"):
        caplog.clear()
        run = tmp_path / f"run-{fields}.trec"
        search(tiny / f"index-{fields}", queries, run, k=3, fields=fields)
        hits = read_trec_run(run)
        assert hits.loc[hits["query_id"] == "long", "doc_id"].iloc[0] in ("d1", "q1"), fields
        assert "1 query has more than Lucene's default 1024 clauses (first 'long'" in caplog.text
        assert "1 of 3 queries got no BM25 hit (first 'nohit'" in caplog.text
        assert "searched 3 queries, 1 over Lucene's default clause limit, 1 without hits" in caplog.text
