"""Ingestion: raw dataset files → the checked Parquet artifacts under ``results/{dataset}/data/``.

Every check raises one :class:`~dpr_pipeline.errors.DataError` naming the file, the line or row, and the
fix; outputs are written atomically, so a failed ingestion leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dpr_pipeline.atomic_writes import atomic_output, atomic_outputs
from dpr_pipeline.data.dev_split import DevSplit, carved_query_ids, normal_text
from dpr_pipeline.data.ids import ID_FIX, id_problem
from dpr_pipeline.data.readers import (
    raw_files,
    raw_paths,
    read_answers,
    read_documents,
    read_judgements,
    read_official_negatives,
    read_queries,
    reader_of,
)
from dpr_pipeline.data.records import Document
from dpr_pipeline.data.schemas import SCHEMAS, read_artifact, write_artifact, write_artifact_batches
from dpr_pipeline.data.text_files import dataset_folder
from dpr_pipeline.errors import DataError

log = logging.getLogger(__name__)

UNKNOWN_ID_POLICIES = ("error", "warn")
#: The qrels artifact's metadata key (``dpr_pipeline.`` prefixed) holding :func:`ingestion_counts`, as JSON.
INGESTION_KEY = "ingestion"
_BATCH_ROWS = 100_000


def _check_id(value: str, what: str, where) -> str:
    """``value`` without surrounding whitespace; whitespace or a control character inside it is an error."""
    value = value.strip()
    problem = id_problem(value)
    if problem:
        raise where.error(f"{what} {value!r} {problem}, which would break the TREC runs and TSV files the "
                          "pipeline writes", ID_FIX)
    return value


def _check_documents(documents: Iterable[Document], skipped: list[Document] | None = None) -> Iterable[Document]:
    """The documents with checked ids; an empty one (no text, no title) is an error, or, when ``skipped`` is a
    list (``skip_empty_documents``), left out and appended to it."""
    seen: set[str] = set()
    for doc in documents:
        doc_id = doc.doc_id.strip()
        if not doc_id:
            raise doc.where.error("empty document id", "give every document a non-empty id")
        _check_id(doc_id, "document id", doc.where)
        if doc_id in seen:
            raise doc.where.error(f"duplicate document id {doc_id!r}", "give every document a unique id "
                                  "(remove or rename the repeated one)")
        seen.add(doc_id)
        if not doc.text.strip() and not doc.title.strip():
            if skipped is not None:
                skipped.append(doc._replace(doc_id=doc_id))
                continue
            raise doc.where.error(f"document {doc_id!r} has empty text (and no title)",
                                  "remove the document or give it text, or set the dataset's "
                                  "`skip_empty_documents: true` to leave such documents out (counted in the log)")
        yield doc._replace(doc_id=doc_id)


def ingest_corpus(fmt: str, root: str | Path, output: str | Path, skip_empty_documents: bool = False) -> int:
    """Write ``corpus.parquet`` (doc_id, title, text) in batches; return the number of documents.

    ``skip_empty_documents``: leave out documents without text and title (Pyserini skips them too), with a
    warning that counts them and names the first; otherwise such a document is an error."""
    skipped: list[Document] | None = [] if skip_empty_documents else None
    count = 0
    schema = SCHEMAS["corpus"]
    with atomic_output(output) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        batch: list[Document] = []

        def flush() -> None:
            writer.write_table(pa.table({"doc_id": [d.doc_id for d in batch], "title": [d.title for d in batch],
                                         "text": [d.text for d in batch]}, schema=schema))
            batch.clear()

        for doc in _check_documents(read_documents(fmt, root), skipped):
            batch.append(doc)
            count += 1
            if len(batch) >= _BATCH_ROWS:
                flush()
        if count == 0:
            raise DataError(", ".join(map(str, raw_files(fmt, root))), "the corpus has no documents",
                            "check the dataset's `path` and `format`")
        if batch:
            flush()
    if skipped:
        first = skipped[0].where
        log.warning("skipped %d empty document(s) (no text, no title; skip_empty_documents: true), first: %r at "
                    "%s, line/row %s; judgements naming them count as unknown documents", len(skipped),
                    skipped[0].doc_id, first.path, first.line or first.row)
    log.info("ingested %d documents from %s (%d empty skipped)", count, root, len(skipped or []))
    return count


def _drop_unknown(judgements: list, field: str, known, where_known: str, policy: str, keep: bool = False):
    """Judgements whose ``field`` id is in ``known``; the others raise (policy error) or are counted.

    ``keep``: return only the number of unknown ones (warned about, not dropped)."""
    unknown = [j for j in judgements if getattr(j, field) not in known]
    if not unknown:
        return 0 if keep else judgements
    first = unknown[0]
    what = field.replace("_id", "")
    if policy == "error":
        raise first.where.error(
            f"{what} id {getattr(first, field)!r} is not in the {where_known} (1 of {len(unknown)} such judgements)",
            f"add the {what} to the {where_known} or remove the judgement; or set the dataset's "
            "`unknown_qrels_ids: warn` to drop such judgements with a counted warning")
    log.warning("%s %d judgement(s) whose %s id is not in the %s (first: %r at %s, line/row %s)",
                "kept" if keep else "dropped", len(unknown), what, where_known, getattr(first, field),
                first.where.path, first.where.line or first.where.row)
    return len(unknown) if keep else [j for j in judgements if getattr(j, field) in known]


def ingest_split(fmt: str, root: str | Path, split: str, corpus: str | Path, queries_out: str | Path,
                 qrels_out: str | Path, unknown_qrels_ids: str = "error", files: dict | None = None, *,
                 evaluation: bool = False, train_queries: str | Path | None = None,
                 allow_overlap: bool | list[str] = False,
                 min_relevance: int = 1, carve: dict | None = None) -> tuple[int, int]:
    """Write ``queries_<split>.parquet`` and ``qrels_<split>.parquet``; return (queries, judgements).

    ``files``: the split's raw file names when they differ from the layout's (``split_files``, msmarco).

    The split's queries are those with at least one judgement. ``unknown_qrels_ids`` says what to do with a
    judgement whose query or document does not exist: ``error`` (default) or ``warn``: count it, drop an unknown
    query's judgements, and drop a judgement naming an unknown document from a train split but keep it in an
    ``evaluation`` split (trec_eval's and BEIR's convention: the query stays and scores what it can; the qrels'
    metadata counts such judgements, ``unknown_documents``, for metrics.json).

    ``train_queries``: the train split's queries artifact, when this is an evaluation split: a query of this split
    with the same id or the same text (whitespace collapsed) as a train query is leakage, a DataError naming both
    files and the count, unless ``allow_overlap`` (true, or the list of the shared evaluation query ids). The log
    reports the queries dropped and why, and those kept without a grade >= ``min_relevance`` (they are not trained
    on or, below 1, not scored).

    ``carve``: this split is one side (``carve["side"]``: ``dev`` or ``train``) of a dev split carved from the
    train split's raw files (:func:`dev_split.carve_of`); ``split`` names the raw split read. The carve is drawn
    among the judged queries that exist, before judgements naming unknown documents are dropped, so both sides
    draw from the same queries; the counts record it.
    """
    if unknown_qrels_ids not in UNKNOWN_ID_POLICIES:
        raise ValueError(f"unknown_qrels_ids must be one of {UNKNOWN_ID_POLICIES}, got {unknown_qrels_ids!r}")
    reader = reader_of(fmt)
    if reader.question_files:
        return _ingest_question_split(reader, root, split, corpus, queries_out, qrels_out, unknown_qrels_ids, files,
                                      train_queries=train_queries, allow_overlap=allow_overlap)
    judgements = _split_judgements(fmt, root, split, files)
    queries = _split_queries(fmt, root, split, files, wanted={qid for qid, _ in judgements})
    if not queries:  # not a matter of unknown ids: `unknown_qrels_ids: warn` would only drop every judgement
        raise DataError(raw_paths(fmt, root, split, files)["queries"], f"the queries file holds no queries (it is "
                        f"empty or only blank lines), so none of the {len(judgements)} judgements of split "
                        f"{split!r} has its query", "write the queries into this file, one per line (check that it "
                        "is the complete file, not an empty or unfinished copy); `unknown_qrels_ids` does not "
                        "apply")
    doc_ids = set(read_artifact(corpus, "corpus", columns=["doc_id"])["doc_id"])

    judged_before = list(dict.fromkeys(j.query_id for j in judgements.values()))
    # the files an unknown id is missing from, named (the judgement's own file is the error's location)
    queries_file = f"queries file {_path_of(queries.values(), fmt, root, split, files, 'queries')}"
    corpus_files = f"corpus ({', '.join(map(str, raw_files(fmt, root)))})"
    kept = _drop_unknown(list(judgements.values()), "query_id", queries, queries_file, unknown_qrels_ids)
    written = carve["name"] if carve is not None and carve["side"] == "dev" else split  # the split this job writes
    if carve is not None:
        kept, judged_before = _carve_side(kept, queries, carve, split)
    after_queries = {j.query_id for j in kept}
    if evaluation:
        unknown_documents = _drop_unknown(kept, "doc_id", doc_ids, corpus_files, unknown_qrels_ids, keep=True)
    else:
        kept = _drop_unknown(kept, "doc_id", doc_ids, corpus_files, unknown_qrels_ids)
        unknown_documents = 0
    if not kept:
        raise DataError(_path_of(judgements.values(), fmt, root, split, files, "qrels"),
                        f"split {split!r} has no judgements left after dropping those naming ids the "
                        f"{queries_file} or the {corpus_files} lacks",
                        "check that the qrels, queries and corpus belong to the same collection")

    qrels = pd.DataFrame({"query_id": [j.query_id for j in kept], "doc_id": [j.doc_id for j in kept],
                          "relevance": [j.relevance for j in kept]})
    judged = list(dict.fromkeys(qrels["query_id"]))
    split_queries = pd.DataFrame({"query_id": judged, "text": [queries[q].text for q in judged]})
    if train_queries is not None:
        first_line = {}
        for j in judgements.values():
            first_line.setdefault(j.query_id, j.where)
        check_overlap(split_queries, first_line, train_queries, written, allow_overlap, compare_ids=True)
    dropped = {"not in the queries file": [q for q in judged_before if q not in after_queries],
               "every judgement names a document not in the corpus": [q for q in judged_before
                                                                      if q in after_queries and q not in judged]}
    counts = report_split(written, split_queries, qrels, dropped, min_relevance, evaluation, unknown_documents)
    if carve is not None:
        counts["dev_split"] = carve
    _write_split(split_queries, qrels, queries_out, qrels_out, counts)
    return len(split_queries), len(qrels)


def _carve_side(judgements: list, queries: dict, carve: dict, split: str) -> tuple[list, list[str]]:
    """The judgements of ``carve``'s side of the dev split carved from ``split``, and that side's query ids."""
    judged = list(dict.fromkeys(j.query_id for j in judgements))
    dev = DevSplit(name=carve["name"], source=split, fraction=carve["fraction"], count=carve["count"],
                   seed=carve["seed"])
    try:
        carved = carved_query_ids(judged, [queries[q].text for q in judged], dev)
    except ValueError as err:
        where = judgements[0].where.path if judgements else split
        raise DataError(where, f"{err} (split {split!r}, {len(judged)} judged queries with their query in the "
                        "queries file)", "give the train split at least 2 judged queries with distinct texts, or "
                        "remove the dataset's `dev_split`") from None
    side = [q for q in judged if (q in carved) == (carve["side"] == "dev")]
    log.info("dev split %r: %d of the %d judged queries of split %r carved off (seed %d); this job writes the %s "
             "side, %d queries", dev.name, len(carved), len(judged), split, dev.seed, carve["side"], len(side))
    wanted = set(side)
    return [j for j in judgements if j.query_id in wanted], side


def _write_split(queries: pd.DataFrame, qrels: pd.DataFrame, queries_out, qrels_out, counts: dict) -> None:
    with atomic_outputs(queries_out, qrels_out) as (queries_tmp, qrels_tmp):
        write_artifact(queries, queries_tmp, "queries")
        write_artifact(qrels, qrels_tmp, "qrels",
                       metadata={"unknown_documents": str(counts["judgements_naming_unknown_documents"]),
                                 INGESTION_KEY: json.dumps(counts)})


def read_ingestion_counts(qrels_path) -> dict | None:
    """The :func:`ingestion_counts` a qrels artifact carries; None for one written before they were recorded."""
    value = (pq.read_schema(qrels_path).metadata or {}).get(f"dpr_pipeline.{INGESTION_KEY}".encode())
    return json.loads(value) if value is not None else None


def check_overlap(split_queries: pd.DataFrame, where: dict, train_queries: str | Path, split: str,
                  allow_overlap: bool | list[str], compare_ids: bool) -> int:
    """Queries of evaluation split ``split`` (``where``: query id -> the raw file location naming it) that the
    train split's queries artifact also holds, by id (``compare_ids``; not for DPR, whose ids are positions in
    each file) or by identical text (whitespace collapsed). Leakage: a DataError naming both files and the
    counts, unless ``allow_overlap`` is true or lists every shared query's id (then a counted warning). Returns
    the number of shared queries."""
    train = read_artifact(train_queries, "queries")
    train_ids = set(train["query_id"]) if compare_ids else set()
    train_texts = {}
    for qid, text in zip(train["query_id"], train["text"]):
        train_texts.setdefault(normal_text(text), qid)
    by_id = [q for q in split_queries["query_id"] if q in train_ids]
    by_text = [(q, t, train_texts[normal_text(t)]) for q, t in zip(split_queries["query_id"], split_queries["text"])
               if q not in train_ids and normal_text(t) in train_texts]
    shared = len(by_id) + len(by_text)
    if not shared:
        return 0

    def describe(by_id, by_text) -> str:
        parts = ([f"{len(by_id)} by query id (first {by_id[0]!r})"] if by_id else []) + (
            [f"{len(by_text)} by identical text (first {by_text[0][0]!r}, the train query {by_text[0][2]!r}: "
             f"{by_text[0][1][:60]!r})"] if by_text else [])
        return (f"{len(by_id) + len(by_text)} of the {len(split_queries)} queries of evaluation split {split!r} are "
                f"also train queries ({train_queries}): {'; '.join(parts)}, so the models would be evaluated on "
                "queries they were trained on (leakage)")

    allowed = set(allow_overlap) if isinstance(allow_overlap, (list, tuple, set)) else None
    if allow_overlap is not True:
        acknowledged = allowed or set()
        new_by_id = [q for q in by_id if q not in acknowledged]
        new_by_text = [entry for entry in by_text if entry[0] not in acknowledged]
        if new_by_id or new_by_text:
            first = new_by_id[0] if new_by_id else new_by_text[0][0]
            raise where[first].error(describe(new_by_id, new_by_text), "remove the shared queries from the train "
                                     "split's files (or from this split), or list their ids in the dataset's "
                                     "`allow_overlap` (or set it to true) if you mean it")
    log.warning("%s; kept because allow_overlap %s", describe(by_id, by_text),
                "is true" if allow_overlap is True else "lists them")
    return shared


def _split_judgements(fmt: str, root, split: str, files: dict | None) -> dict:
    """The split's judgements by (query id, doc id), ids checked; a repeated pair or none at all is an error."""
    judgements = {}
    for j in read_judgements(fmt, root, split, files):
        if not j.query_id.strip() or not j.doc_id.strip():
            raise j.where.error("empty query or document id", "give every judgement both ids")
        j = j._replace(query_id=_check_id(j.query_id, "query id", j.where),
                       doc_id=_check_id(j.doc_id, "document id", j.where))
        if (j.query_id, j.doc_id) in judgements:
            raise j.where.error(f"repeated judgement for query {j.query_id!r} and document {j.doc_id!r}",
                                "keep one line per (query, document) pair")
        judgements[(j.query_id, j.doc_id)] = j
    if not judgements:
        raise DataError(_path_of((), fmt, root, split, files, "qrels"), f"split {split!r} has no judgements",
                        "give the split's qrels file judgement lines, or remove the split from the dataset's "
                        "train_split/eval_splits")
    return judgements


def _path_of(records, fmt: str, root, split: str, files: dict | None, role: str) -> Path:
    """The raw file ``records`` were read from (the first one's), else the split's file of ``role`` as the
    format names it."""
    first = next(iter(records), None)
    return first.where.path if first is not None else raw_paths(fmt, root, split, files)[role]


def _split_queries(fmt: str, root, split: str, files: dict | None, wanted: set[str]) -> dict:
    """The split's queries by id; an empty or repeated id, or a ``wanted`` (judged) query without text, is an
    error."""
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
    return queries


def ingestion_counts(queries: int, judgements: int, dropped: dict[str, list], unknown_documents: int, *,
                     without_positive: int, positive_grade: int) -> dict:
    """What ingestion did to a split, as the qrels artifact's metadata (``ingestion``, :data:`INGESTION_KEY`) and
    the split's manifest record it, and metrics.json repeats (docs/artifacts.md): the queries and judgements
    written, the queries ``dropped`` per reason, the queries kept without a grade >= ``positive_grade`` (not
    scored, or not trained on), and the judgements naming documents the corpus lacks (kept in an evaluation
    split)."""
    return {"queries": queries, "judgements": judgements,
            "queries_dropped": {why: len(ids) for why, ids in dropped.items() if ids},
            "queries_without_positive": without_positive, "positive_grade": positive_grade,
            "judgements_naming_unknown_documents": unknown_documents}


def report_split(split: str, split_queries: pd.DataFrame, qrels: pd.DataFrame, dropped: dict[str, list],
                 min_relevance: int, evaluation: bool, unknown_documents: int) -> dict:
    """Log what the split holds, the queries dropped and why, and the queries kept without a positive grade
    (not scored when below 1, not trained on when below ``min_relevance``); return the counts."""
    level = 1 if evaluation else min_relevance
    best = qrels.groupby("query_id")["relevance"].max()
    without_positive = [q for q in split_queries["query_id"] if best.get(q, 0) < level]
    counts = ingestion_counts(len(split_queries), len(qrels), dropped, unknown_documents,
                              without_positive=len(without_positive), positive_grade=level)
    log.info("split %s: %d queries, %d judgements", split, len(split_queries), len(qrels))
    for why, ids in dropped.items():
        if ids:
            log.warning("split %s: dropped %d quer%s: %s (first %r)", split, len(ids), "y" if len(ids) == 1 else
                        "ies", why, ids[0])
    if without_positive:
        log.warning("split %s: %d quer%s kept without a judgement of grade >= %d (first %r): %s", split,
                    len(without_positive), "y" if len(without_positive) == 1 else "ies", level, without_positive[0],
                    "not scored by the evaluation" if evaluation else "not trained on (min_relevance)")
    if unknown_documents:
        log.warning("split %s: kept %d judgement(s) naming documents not in the corpus: their queries stay in the "
                    "evaluation and score only what they can (trec_eval/BEIR); metrics.json counts them", split,
                    unknown_documents)
    return counts


def _ingest_question_split(reader, root, split: str, corpus, queries_out, qrels_out, unknown_qrels_ids: str,
                           files: dict | None, *, train_queries=None,
                           allow_overlap: bool | list[str] = False) -> tuple[int, int]:
    """A split of question files (``reader.question_files``, DPR): *every* question is a query (relevance comes
    from answers, not judgements); the qrels are the ``positive_ctxs`` of a bi-encoder JSON (none for a .qa.csv
    split). Leakage against ``train_queries`` is checked by question text only (a question's id is its position
    in its own file)."""
    queries, judgements, where = [], [], {}
    for q in reader.questions(dataset_folder(root), split, files):
        where[q.query_id] = q.where
        if not q.text.strip():
            raise q.where.error(f"question {q.query_id} has empty text", "give the question its text or remove it")
        queries.append((q.query_id, q.text))
        judgements += [_DprJudgement(q.where, q.query_id, pid) for pid in q.positive_ids]
    if not queries:
        raise DataError(root, f"split {split!r} has no questions", "check the split's file (split_files)")
    doc_ids = set(read_artifact(corpus, "corpus", columns=["doc_id"])["doc_id"])
    kept = _drop_unknown(judgements, "doc_id", doc_ids, "corpus", unknown_qrels_ids)
    qrels = pd.DataFrame({"query_id": [j.query_id for j in kept], "doc_id": [j.doc_id for j in kept],
                          "relevance": [1] * len(kept)})
    if train_queries is not None:
        check_overlap(pd.DataFrame(queries, columns=["query_id", "text"]), where, train_queries, split,
                      allow_overlap, compare_ids=False)
    counts = ingestion_counts(len(queries), len(qrels), {}, 0, without_positive=0, positive_grade=1)
    _write_split(pd.DataFrame(queries, columns=["query_id", "text"]), qrels, queries_out, qrels_out, counts)
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


OFFICIAL_NEGATIVES_BATCH = 1000  # queries per written row group (MS MARCO: ~1,000 negatives each)


def ingest_official_negatives(path: str | Path, qrels: str | Path, output: str | Path,
                              min_relevance: int = 1) -> int:
    """Official BM25 negatives → the negatives artifact (scores unknown: NaN); return the query count.

    Queries without a positive judgement are skipped; listed positives are removed from the negatives. Written
    :data:`OFFICIAL_NEGATIVES_BATCH` queries at a time, so memory does not grow with the file (MS MARCO's
    qidpidtriples: ~400M lines).
    """
    judged = read_artifact(qrels, "qrels")
    positives = judged[judged["relevance"] >= min_relevance].groupby("query_id")["doc_id"].apply(list).to_dict()

    def batches() -> Iterator[pd.DataFrame]:
        rows, written = [], 0
        for entry in read_official_negatives(path):
            if entry.query_id not in positives:
                continue
            pos = positives[entry.query_id]
            pos_set = set(pos)
            negs = [d for d in entry.doc_ids if d not in pos_set]
            rows.append({"query_id": entry.query_id, "positive_ids": pos, "positive_scores": [float("nan")] * len(pos),
                         "negative_ids": negs, "negative_scores": [float("nan")] * len(negs)})
            if len(rows) == OFFICIAL_NEGATIVES_BATCH:
                yield pd.DataFrame(rows)
                written += len(rows)
                rows = []
        if rows:
            yield pd.DataFrame(rows)
        elif not written:
            raise DataError(path, "no line names a train query with a positive judgement",
                            "check that the negatives file belongs to the dataset's train split")

    return write_artifact_batches(batches(), output, "negatives", metadata={"source": "official"})
