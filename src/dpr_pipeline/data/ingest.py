"""Ingestion: raw dataset files → the checked Parquet artifacts under ``results/{dataset}/data/``.

Every check raises one :class:`~dpr_pipeline.errors.DataError` naming the file, the line or row, and the
fix; outputs are written atomically, so a failed ingestion leaves nothing behind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DataError
from ..io import atomic_output, atomic_outputs
from .readers import (Document, read_answers, read_documents, read_judgements, read_official_negatives,
                      read_queries)
from .schemas import SCHEMAS, read_artifact, write_artifact

log = logging.getLogger(__name__)

UNKNOWN_ID_POLICIES = ("error", "warn")
_BATCH_ROWS = 100_000


def _check_documents(documents: Iterable[Document]) -> Iterable[Document]:
    seen: set[str] = set()
    for doc in documents:
        doc_id = doc.doc_id.strip()
        if not doc_id:
            raise doc.where.error("empty document id", "give every document a non-empty id")
        if doc_id in seen:
            raise doc.where.error(f"duplicate document id {doc_id!r}", "give every document a unique id "
                                  "(remove or rename the repeated one)")
        seen.add(doc_id)
        if not doc.text.strip() and not doc.title.strip():
            raise doc.where.error(f"document {doc_id!r} has empty text (and no title)",
                                  "remove the document or give it text")
        yield doc._replace(doc_id=doc_id)


def ingest_corpus(fmt: str, root: str | Path, output: str | Path) -> int:
    """Write ``corpus.parquet`` (doc_id, title, text) in batches; return the number of documents."""
    count = 0
    schema = SCHEMAS["corpus"]
    with atomic_output(output) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        batch: list[Document] = []

        def flush() -> None:
            writer.write_table(pa.table({"doc_id": [d.doc_id for d in batch], "title": [d.title for d in batch],
                                         "text": [d.text for d in batch]}, schema=schema))
            batch.clear()

        for doc in _check_documents(read_documents(fmt, root)):
            batch.append(doc)
            count += 1
            if len(batch) >= _BATCH_ROWS:
                flush()
        if count == 0:
            raise DataError(root, "the corpus has no documents", "check the dataset's `path` and `format`")
        if batch:
            flush()
    log.info("ingested %d documents from %s", count, root)
    return count


def _drop_unknown(judgements: list, field: str, known, where_known: str, policy: str) -> list:
    """Judgements whose ``field`` id is in ``known``; the others raise (policy error) or are counted."""
    unknown = [j for j in judgements if getattr(j, field) not in known]
    if not unknown:
        return judgements
    first = unknown[0]
    what = field.replace("_id", "")
    if policy == "error":
        raise first.where.error(
            f"{what} id {getattr(first, field)!r} is not in the {where_known} (1 of {len(unknown)} such judgements)",
            f"add the {what} to the {where_known} or remove the judgement; or set the dataset's "
            "`unknown_qrels_ids: warn` to drop such judgements with a counted warning")
    log.warning("dropped %d judgement(s) whose %s id is not in the %s (first: %r at %s, line/row %s)",
                len(unknown), what, where_known, getattr(first, field), first.where.path,
                first.where.line or first.where.row)
    return [j for j in judgements if getattr(j, field) in known]


def ingest_split(fmt: str, root: str | Path, split: str, corpus: str | Path, queries_out: str | Path,
                 qrels_out: str | Path, unknown_ids: str = "error",
                 files: dict | None = None) -> tuple[int, int]:
    """Write ``queries_<split>.parquet`` and ``qrels_<split>.parquet``; return (queries, judgements).

    ``files``: the split's raw file names when they differ from the layout's (``split_files``, msmarco).

    The split's queries are those with at least one judgement. ``unknown_ids`` says what to do with a
    judgement whose query or document does not exist: ``error`` (default) or ``warn`` (drop and count).
    """
    if unknown_ids not in UNKNOWN_ID_POLICIES:
        raise ValueError(f"unknown_ids must be one of {UNKNOWN_ID_POLICIES}, got {unknown_ids!r}")
    if fmt == "dpr":
        return _ingest_dpr_split(root, split, corpus, queries_out, qrels_out, unknown_ids, files)
    judgements = {}
    for j in read_judgements(fmt, root, split, files):
        if not j.query_id.strip() or not j.doc_id.strip():
            raise j.where.error("empty query or document id", "give every judgement both ids")
        if (j.query_id, j.doc_id) in judgements:
            raise j.where.error(f"repeated judgement for query {j.query_id!r} and document {j.doc_id!r}",
                                "keep one line per (query, document) pair")
        judgements[(j.query_id, j.doc_id)] = j
    if not judgements:
        raise DataError(root, f"split {split!r} has no judgements", "give the split's qrels file "
                        "judgement lines, or remove the split from the dataset's train_split/eval_splits")

    wanted = {qid for qid, _ in judgements}
    queries = {}
    for q in read_queries(fmt, root, split, files):
        query_id = q.query_id.strip()
        if not query_id:
            raise q.where.error("empty query id", "give every query a non-empty id")
        if query_id in queries:
            raise q.where.error(f"duplicate query id {query_id!r}", "give every query a unique id")
        if query_id in wanted and not q.text.strip():
            raise q.where.error(f"query {query_id!r} has empty text", "give the query its text or remove it")
        queries[query_id] = q
    doc_ids = set(read_artifact(corpus, "corpus", columns=["doc_id"])["doc_id"])

    kept = _drop_unknown(list(judgements.values()), "query_id", queries, "queries file", unknown_ids)
    kept = _drop_unknown(kept, "doc_id", doc_ids, "corpus", unknown_ids)
    if not kept:
        raise DataError(root, f"split {split!r} has no judgements left after dropping unknown ids",
                        "check that the qrels, queries and corpus belong to the same collection")

    qrels = pd.DataFrame({"query_id": [j.query_id for j in kept], "doc_id": [j.doc_id for j in kept],
                          "relevance": [j.relevance for j in kept]})
    judged = list(dict.fromkeys(qrels["query_id"]))
    split_queries = pd.DataFrame({"query_id": judged, "text": [queries[q].text for q in judged]})
    with atomic_outputs(queries_out, qrels_out) as (queries_tmp, qrels_tmp):
        write_artifact(split_queries, queries_tmp, "queries")
        write_artifact(qrels, qrels_tmp, "qrels")
    log.info("split %s: %d queries, %d judgements", split, len(split_queries), len(qrels))
    return len(split_queries), len(qrels)


def _ingest_dpr_split(root, split: str, corpus, queries_out, qrels_out, unknown_ids: str,
                      files: dict | None) -> tuple[int, int]:
    """A DPR split: *every* question is a query (relevance comes from answers, not judgements); the qrels are
    the ``positive_ctxs`` of a bi-encoder JSON (none for a .qa.csv split)."""
    queries, judgements = [], []
    for q in read_answers(root, split, files):
        if not q.text.strip():
            raise q.where.error(f"question {q.query_id} has empty text", "give the question its text or remove it")
        queries.append((q.query_id, q.text))
        judgements += [_DprJudgement(q.where, q.query_id, pid) for pid in q.positive_ids]
    if not queries:
        raise DataError(root, f"split {split!r} has no questions", "check the split's file (split_files)")
    doc_ids = set(read_artifact(corpus, "corpus", columns=["doc_id"])["doc_id"])
    kept = _drop_unknown(judgements, "doc_id", doc_ids, "corpus", unknown_ids)
    qrels = pd.DataFrame({"query_id": [j.query_id for j in kept], "doc_id": [j.doc_id for j in kept],
                          "relevance": [1] * len(kept)})
    with atomic_outputs(queries_out, qrels_out) as (queries_tmp, qrels_tmp):
        write_artifact(pd.DataFrame(queries, columns=["query_id", "text"]), queries_tmp, "queries")
        write_artifact(qrels, qrels_tmp, "qrels")
    log.info("split %s: %d questions, %d positive passages", split, len(queries), len(qrels))
    return len(queries), len(qrels)


class _DprJudgement(NamedTuple):
    where: object
    query_id: str
    doc_id: str


def ingest_answers(root: str | Path, split: str, output: str | Path, files: dict | None = None) -> int:
    """Write ``answers_<split>.parquet`` (query_id, answers) of a ``dpr`` split; return the question count."""
    rows = [(q.query_id, [a for a in q.answers if a.strip()]) for q in read_answers(root, split, files)]
    if not rows:
        raise DataError(root, f"split {split!r} has no questions", "check the split's file (split_files)")
    write_artifact(pd.DataFrame(rows, columns=["query_id", "answers"]), output, "answers")
    log.info("split %s: answers of %d questions", split, len(rows))
    return len(rows)


def ingest_official_negatives(path: str | Path, qrels: str | Path, output: str | Path,
                              min_relevance: int = 1) -> int:
    """Official BM25 negatives → the negatives artifact (scores unknown: NaN); return the query count.

    Queries without a positive judgement are skipped; listed positives are removed from the negatives.
    """
    judged = read_artifact(qrels, "qrels")
    positives = judged[judged["relevance"] >= min_relevance].groupby("query_id")["doc_id"].apply(list).to_dict()
    rows = []
    for entry in read_official_negatives(path):
        if entry.query_id not in positives:
            continue
        pos = positives[entry.query_id]
        pos_set = set(pos)
        negs = [d for d in entry.doc_ids if d not in pos_set]
        rows.append({"query_id": entry.query_id, "positive_ids": pos, "positive_scores": [float("nan")] * len(pos),
                     "negative_ids": negs, "negative_scores": [float("nan")] * len(negs)})
    if not rows:
        raise DataError(path, "no line names a train query with a positive judgement",
                        "check that the negatives file belongs to the dataset's train split")
    write_artifact(pd.DataFrame(rows), output, "negatives", metadata={"source": "official"})
    return len(rows)
