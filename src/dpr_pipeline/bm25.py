"""BM25 with Pyserini (Lucene): index a corpus artifact and retrieve for a queries artifact.

Two indexing choices, as in Pyserini's BEIR regressions:

* ``flat``: title and text joined by a space into one ``contents`` field (Pyserini ``bm25-flat``);
* ``multifield``: title and text indexed as separate fields, queried with equal weights (``bm25-multifield``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from .data.schemas import check_schema, read_artifact
from .io import atomic_output
from .runs import write_trec_run

log = logging.getLogger(__name__)

FIELD_CHOICES = ("flat", "multifield")


def _write_json_collection(corpus: Path, folder: Path, fields: str, shards: int) -> int:
    """Write the corpus as Pyserini JsonCollection files (one per thread), batch by batch."""
    parquet = pq.ParquetFile(corpus)
    check_schema(parquet.schema_arrow, "corpus", corpus)
    handles = [open(folder / f"part-{i:03d}.jsonl", "w", encoding="utf-8") for i in range(shards)]
    count = 0
    try:
        for batch in parquet.iter_batches(columns=["doc_id", "title", "text"], batch_size=65536):
            for doc in batch.to_pylist():
                title, text = doc["title"] or "", doc["text"] or ""
                if fields == "flat":
                    record = {"id": doc["doc_id"], "contents": f"{title} {text}".strip()}
                else:
                    record = {"id": doc["doc_id"], "contents": text, "title": title}
                handles[count % shards].write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
    finally:
        for handle in handles:
            handle.close()
    return count


def build_index(corpus: str | Path, index: str | Path, fields: str = "flat", threads: int = 1) -> None:
    """Build a Lucene index of ``corpus.parquet`` with Pyserini's indexer (positions, docvectors, raw)."""
    if fields not in FIELD_CHOICES:
        raise ValueError(f"fields must be one of {FIELD_CHOICES}, got {fields!r}")
    with atomic_output(index) as tmp:
        collection = tmp.parent / "collection"
        collection.mkdir()
        count = _write_json_collection(Path(corpus), collection, fields, max(1, threads))
        command = [sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                   "--input", str(collection), "--index", str(tmp),
                   "--generator", "DefaultLuceneDocumentGenerator", "--threads", str(max(1, threads)),
                   "--storePositions", "--storeDocvectors", "--storeRaw"]
        if fields == "multifield":
            command += ["--fields", "title"]
        log.info("indexing %d documents: %s", count, " ".join(command))
        done = subprocess.run(command, capture_output=True, text=True)
        log.info("%s", done.stdout[-20000:] + done.stderr[-20000:])
        if done.returncode != 0:
            raise RuntimeError(f"Pyserini indexing failed (exit {done.returncode}):\n{done.stderr[-5000:]}")
        from pyserini.index.lucene import IndexReader

        indexed = IndexReader(str(tmp)).stats()["documents"]
        if indexed != count:
            raise RuntimeError(f"Pyserini indexed {indexed} documents, the corpus has {count}")


#: Lucene's default limit on the clauses of one query; Pyserini's bag-of-words query has one per distinct term
#: (per field), and a query over it fails inside Lucene's search threads, leaving the query without hits.
LUCENE_DEFAULT_MAX_CLAUSES = 1024


def query_clauses(texts: list[str], fields: str = "flat") -> list[int]:
    """Lucene clauses of each query as Pyserini builds it: one per distinct analyzed term (Pyserini's default
    English analyzer, as the searcher uses), per field, plus one per field for ``multifield``."""
    from pyserini.analysis import Analyzer, get_lucene_analyzer

    analyzer = Analyzer(get_lucene_analyzer())
    per_field = 2 if fields == "multifield" else 1
    return [len(set(analyzer.analyze(text))) * per_field + (per_field if per_field > 1 else 0) for text in texts]


def allow_clauses(needed: int) -> int:
    """Raise Lucene's process-wide clause limit (``IndexSearcher.setMaxClauseCount``) to at least ``needed``;
    return the limit in force."""
    from jnius import autoclass

    searcher_class = autoclass("org.apache.lucene.search.IndexSearcher")
    if needed > searcher_class.getMaxClauseCount():
        searcher_class.setMaxClauseCount(int(needed))
    return int(searcher_class.getMaxClauseCount())


def search(index: str | Path, queries: str | Path, run: str | Path, *, k: int = 1000, k1: float = 0.9,
           b: float = 0.4, fields: str = "flat", threads: int = 1, batch_size: int = 256,
           remove_query_id_hits: bool = False, tag: str = "bm25") -> int:
    """Retrieve the top ``k`` documents per query with Lucene BM25 and write a TREC run.

    ``remove_query_id_hits`` drops a hit whose doc id equals the query id (Pyserini's ``--remove-query``,
    used in its BEIR regressions), still returning ``k`` hits. Returns the number of queries.

    Queries with more clauses than Lucene's default limit (1,024 distinct terms: a pasted document as a query)
    are searched in full: the limit is raised to the longest query's clauses, with a warning that counts them.
    Queries left without any hit are counted in the log too (they score 0 in the evaluation).
    """
    from pyserini.search.lucene import LuceneSearcher

    if fields not in FIELD_CHOICES:
        raise ValueError(f"fields must be one of {FIELD_CHOICES}, got {fields!r}")
    frame = read_artifact(queries, "queries")
    searcher = LuceneSearcher(str(index))
    searcher.set_bm25(k1, b)
    clauses = query_clauses(frame["text"].tolist(), fields)
    over = [(qid, n) for qid, n in zip(frame["query_id"], clauses) if n > LUCENE_DEFAULT_MAX_CLAUSES]
    if over:
        limit = allow_clauses(max(n for _, n in over))
        log.warning("%d quer%s more than Lucene's default %d clauses (first %r: %d; longest %d): raised Lucene's "
                    "max clause count to %d so they are searched in full", len(over),
                    "y has" if len(over) == 1 else "ies have", LUCENE_DEFAULT_MAX_CLAUSES, over[0][0], over[0][1],
                    max(n for _, n in over), limit)
    without_hits = []
    field_weights = {"contents": 1.0, "title": 1.0} if fields == "multifield" else None
    depth = k + 1 if remove_query_id_hits else k

    def results():
        ids, texts = frame["query_id"].tolist(), frame["text"].tolist()
        for start in tqdm(range(0, len(ids), batch_size), desc="bm25 search", unit="batch", file=sys.stderr):
            qids, qtexts = ids[start:start + batch_size], texts[start:start + batch_size]
            extra = {"fields": field_weights} if field_weights else {}
            hits = searcher.batch_search(qtexts, qids, k=depth, threads=threads, **extra)
            for qid in qids:
                pairs = [(h.docid, h.score) for h in hits.get(qid, [])
                         if not (remove_query_id_hits and h.docid == qid)]
                if not pairs:
                    without_hits.append(qid)
                yield qid, pairs[:k]

    write_trec_run(results(), run, tag)
    if without_hits:
        log.warning("%d of %d quer%s got no BM25 hit (first %r; no query term in the index?): they score 0 in the "
                    "evaluation", len(without_hits), len(frame), "y" if len(frame) == 1 else "ies", without_hits[0])
    log.info("searched %d queries, %d over Lucene's default clause limit, %d without hits", len(frame), len(over),
             len(without_hits))
    return len(frame)
