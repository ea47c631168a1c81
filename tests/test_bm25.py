"""Pyserini BM25 on a tiny corpus: indexing, both field choices, --remove-query behaviour."""

import json
import logging
import os
import subprocess
import sys
import weakref

import pandas as pd
import pytest
from conftest import REPO, write_beir

from dpr_pipeline.data.ingest import ingest_corpus, ingest_split
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.retrieval import bm25
from dpr_pipeline.retrieval.bm25 import build_index, search

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
    assert search(tiny / f"index-{fields}", tiny / "queries.parquet", tiny / "run.trec", depth=3, fields=fields) == 2
    run = read_trec_run(tiny / "run.trec")
    top = run[run["rank"] == 1].set_index("query_id")["doc_id"].to_dict()
    assert top == {"q1": "d1", "q2": "d2"}
    assert run.groupby("query_id").size().max() <= 3
    assert (run.groupby("query_id")["score"].apply(lambda s: s.is_monotonic_decreasing)).all()


def test_title_is_searchable_in_flat_index(tiny):
    """'machines' only occurs in d3's title, so the title must have been indexed with the text."""
    pd.DataFrame({"query_id": ["t"], "text": ["machines"]}).to_parquet(tiny / "q.parquet")
    search(tiny / "index-flat", tiny / "q.parquet", tiny / "t.trec", depth=5)
    assert read_trec_run(tiny / "t.trec")["doc_id"].tolist() == ["d3"]


def test_ignore_identical_ids_keeps_depth_hits(tiny):
    search(tiny / "index-flat", tiny / "queries.parquet", tiny / "keep.trec", depth=2)
    search(tiny / "index-flat", tiny / "queries.parquet", tiny / "drop.trec", depth=2, ignore_identical_ids=True)
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
        search(tiny / f"index-{fields}", queries, run, depth=3, fields=fields)
        hits = read_trec_run(run)
        assert hits.loc[hits["query_id"] == "long", "doc_id"].iloc[0] in ("d1", "q1"), fields
        assert "1 query has more than Lucene's default 1024 clauses (first 'long'" in caplog.text
        assert "1 of 3 queries got no BM25 hit (first 'nohit'" in caplog.text
        assert "searched 3 queries, 1 over Lucene's default clause limit, 1 without hits" in caplog.text



class _Hits(dict):
    """A batch's hits that a weak reference can watch."""


def test_the_run_is_the_same_whatever_the_batches(tiny, tmp_path, monkeypatch):
    """Batches of one query, the default batches and one batch of all the queries write the same bytes. A default
    batch holds at most HITS_PER_BATCH hits, and each batch's hits are released before the next is searched."""
    from pyserini.search.lucene import LuceneSearcher

    texts = ["cats purr", "dogs", "why do cats purr", "purr machines", "xyzzy", "low sound", "q1 cats", "bark"]
    queries = tmp_path / "queries.parquet"
    pd.DataFrame({"query_id": [f"q{i}" for i in range(len(texts))], "text": texts}).to_parquet(queries)
    monkeypatch.setattr(bm25, "HITS_PER_BATCH", 9)  # depth 3 (4 with ignore_identical_ids): 3 or 2 queries a batch
    original, held, batches = LuceneSearcher.batch_search, [], []

    def recording(self, qtexts, qids, k, **kwargs):
        assert all(alive() is None for alive in held), "the previous batch's hits are still held"
        hits = _Hits(original(self, qtexts, qids, k=k, **kwargs))
        held.append(weakref.ref(hits))
        batches.append(len(qids) * k)
        return hits

    monkeypatch.setattr(LuceneSearcher, "batch_search", recording)
    for fields in ("flat", "multifield"):
        for remove in (False, True):
            runs = []
            for batch_size in (1, None, 100):
                batches.clear()
                run = tmp_path / f"run-{fields}-{remove}-{batch_size}.trec"
                search(tiny / f"index-{fields}", queries, run, depth=3, fields=fields, ignore_identical_ids=remove,
                       batch_size=batch_size)
                assert len(batches) == {1: len(texts), None: 4 if remove else 3, 100: 1}[batch_size]
                runs.append(run.read_bytes())
            assert runs[0] and runs[0] == runs[1] == runs[2], (fields, remove)
            assert b"q4 Q0" not in runs[0] and runs[0].count(b"\n") > len(texts)


def test_java_heap_reaches_the_jvm(tiny, tmp_path):
    """The JVM starts once per process, so a fresh Python searches with java_heap 300m and reports its JVM."""
    code = f"""
import json, sys
from dpr_pipeline.retrieval.bm25 import search
search({str(tiny / "index-flat")!r}, {str(tiny / "queries.parquet")!r}, {str(tmp_path / "run.trec")!r}, depth=2,
       java_heap="300m")
from jnius import autoclass
arguments = autoclass("java.lang.management.ManagementFactory").getRuntimeMXBean().getInputArguments()
print(json.dumps({{"max_mb": autoclass("java.lang.Runtime").getRuntime().maxMemory() / 2**20,
                  "arguments": [arguments.get(i) for i in range(arguments.size())]}}))
"""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    jvm = json.loads(done.stdout.strip().splitlines()[-1])
    assert "-Xmx300m" in jvm["arguments"] and "-XX:+ExitOnOutOfMemoryError" in jvm["arguments"]
    assert 280 <= jvm["max_mb"] <= 310
    assert (tmp_path / "run.trec").read_text().count("\n") > 0


@pytest.mark.parametrize("heap", ["1 g", "0g", "lots", "2gb", 2])
def test_a_bad_java_heap_is_refused(heap):
    with pytest.raises(ValueError, match="java_heap must be a size"):
        bm25.start_jvm(heap)
