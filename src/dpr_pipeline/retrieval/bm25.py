"""BM25 with Pyserini (Lucene): index a corpus artifact and retrieve for a queries artifact.

Two indexing choices, as in Pyserini's BEIR regressions:

* ``flat``: title and text joined by a space into one ``contents`` field (Pyserini ``bm25-flat``);
* ``multifield``: title and text indexed as separate fields, queried with equal weights (``bm25-multifield``).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.schemas import check_schema, read_artifact
from dpr_pipeline.data.trec_runs import write_trec_run

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


#: Default maximum Java heap (``-Xmx``) of the search's JVM (``stages.bm25.java_heap``). Left to itself the JVM may
#: grow its heap to a quarter of the machine's memory before collecting: on a 1M-passage corpus at depth 1000 the
#: job grew about 1 MB per query (3.3 GB at 2,000 queries) although a batch's hits are only ~60 MB.
DEFAULT_JAVA_HEAP = "1g"
#: Hits (queries x depth) one ``batch_search`` call holds at most: every hit carries its stored document.
HITS_PER_BATCH = 65_536
_HEAP = re.compile(r"[1-9][0-9]*[kKmMgG]")


def start_jvm(java_heap: str | None = DEFAULT_JAVA_HEAP) -> None:
    """Start Pyserini's JVM (it runs inside this process) with a maximum heap of ``java_heap`` (``-Xmx``, e.g.
    ``1g``; None: the JVM's default), exiting on a Java ``OutOfMemoryError`` rather than losing a search
    thread's queries. A process starts its JVM only once: if it already runs, this warns and changes nothing."""
    import jnius_config

    if java_heap is not None and not _HEAP.fullmatch(str(java_heap)):
        raise ValueError(f"java_heap must be a size like 512m or 2g, got {java_heap!r}")
    if jnius_config.vm_running:
        if java_heap is not None:
            from jnius import autoclass

            in_force = autoclass("java.lang.Runtime").getRuntime().maxMemory() // 2**20
            log.warning("the JVM already runs in this process (max heap %d MB): java_heap %s is not applied",
                        in_force, java_heap)
        return
    options = [o for o in jnius_config.get_options() if not o.startswith("-Xmx")]
    if java_heap is not None:
        options.append(f"-Xmx{java_heap}")
    if "-XX:+ExitOnOutOfMemoryError" not in options:
        options.append("-XX:+ExitOnOutOfMemoryError")
    jnius_config.set_options(*options)


def _allow_long_queries(frame, fields: str) -> list[tuple[str, int]]:
    """The queries over Lucene's default clause limit, as (query id, clauses); when there are any, the limit is
    raised to the longest one's clauses (with a warning that counts them), so they are searched in full."""
    clauses = query_clauses(frame["text"].tolist(), fields)
    over = [(qid, n) for qid, n in zip(frame["query_id"], clauses) if n > LUCENE_DEFAULT_MAX_CLAUSES]
    if over:
        limit = allow_clauses(max(n for _, n in over))
        log.warning("%d quer%s more than Lucene's default %d clauses (first %r: %d; longest %d): raised Lucene's "
                    "max clause count to %d so they are searched in full", len(over),
                    "y has" if len(over) == 1 else "ies have", LUCENE_DEFAULT_MAX_CLAUSES, over[0][0], over[0][1],
                    max(n for _, n in over), limit)
    return over


def search(index: str | Path, queries: str | Path, run: str | Path, *, depth: int = 1000, k1: float = 0.9,
           b: float = 0.4, fields: str = "flat", threads: int = 1, batch_size: int | None = None,
           ignore_identical_ids: bool = False, tag: str = "bm25",
           java_heap: str | None = DEFAULT_JAVA_HEAP) -> int:
    """Retrieve the top ``depth`` documents per query with Lucene BM25 and write a TREC run.

    ``ignore_identical_ids`` drops a hit whose doc id equals the query id (BEIR's setting; Pyserini's
    ``--remove-query`` in its BEIR regressions), still returning ``depth`` hits. Returns the number of queries.

    Queries with more clauses than Lucene's default limit (1,024 distinct terms: a pasted document as a query)
    are searched in full: the limit is raised to the longest query's clauses, with a warning that counts them.
    Queries left without any hit are counted in the log too (they score 0 in the evaluation).

    Memory does not grow with the number of queries: they are searched ``batch_size`` at a time (default: as
    many as make ``HITS_PER_BATCH`` hits, at least ``threads``, at most 256), each batch's hits are written and
    released before the next, and the JVM's heap is capped at ``java_heap`` (see ``start_jvm``).
    """
    if fields not in FIELD_CHOICES:
        raise ValueError(f"fields must be one of {FIELD_CHOICES}, got {fields!r}")
    start_jvm(java_heap)
    from pyserini.search.lucene import LuceneSearcher

    frame = read_artifact(queries, "queries")
    searcher = LuceneSearcher(str(index))
    searcher.set_bm25(k1, b)
    over = _allow_long_queries(frame, fields)
    without_hits = {"count": 0, "first": None}
    field_weights = {"contents": 1.0, "title": 1.0} if fields == "multifield" else None
    searched = depth + 1 if ignore_identical_ids else depth
    if batch_size is None:
        batch_size = min(256, max(threads, HITS_PER_BATCH // searched))

    def results():
        ids, texts = frame["query_id"].tolist(), frame["text"].tolist()
        for start in tqdm(range(0, len(ids), batch_size), desc="bm25 search", unit="batch", file=sys.stderr):
            qids, qtexts = ids[start:start + batch_size], texts[start:start + batch_size]
            extra = {"fields": field_weights} if field_weights else {}
            hits = searcher.batch_search(qtexts, qids, k=searched, threads=threads, **extra)
            for qid in qids:
                pairs = [(h.docid, h.score) for h in hits.pop(qid, [])
                         if not (ignore_identical_ids and h.docid == qid)]
                if not pairs:
                    without_hits["count"] += 1
                    without_hits["first"] = without_hits["first"] or qid
                yield qid, pairs[:depth]
            del hits  # release this batch's Java hits before the next batch is searched

    write_trec_run(results(), run, tag)
    if without_hits["count"]:
        log.warning("%d of %d quer%s got no BM25 hit (first %r; no query term in the index?): they score 0 in the "
                    "evaluation", without_hits["count"], len(frame), "y" if len(frame) == 1 else "ies",
                    without_hits["first"])
    log.info("searched %d queries, %d over Lucene's default clause limit, %d without hits", len(frame), len(over),
             without_hits["count"])
    return len(frame)
