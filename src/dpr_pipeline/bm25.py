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


def search(index: str | Path, queries: str | Path, run: str | Path, *, k: int = 1000, k1: float = 0.9,
           b: float = 0.4, fields: str = "flat", threads: int = 1, batch_size: int = 256,
           remove_query_id_hits: bool = False, tag: str = "bm25") -> int:
    """Retrieve the top ``k`` documents per query with Lucene BM25 and write a TREC run.

    ``remove_query_id_hits`` drops a hit whose doc id equals the query id (Pyserini's ``--remove-query``,
    used in its BEIR regressions), still returning ``k`` hits. Returns the number of queries.
    """
    from pyserini.search.lucene import LuceneSearcher

    if fields not in FIELD_CHOICES:
        raise ValueError(f"fields must be one of {FIELD_CHOICES}, got {fields!r}")
    frame = read_artifact(queries, "queries")
    searcher = LuceneSearcher(str(index))
    searcher.set_bm25(k1, b)
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
                yield qid, pairs[:k]

    write_trec_run(results(), run, tag)
    return len(frame)
