"""Readers for the three raw dataset layouts. They only parse; ``ingest`` checks what they yield.

Every reader yields records that carry their :class:`Location`, so a later check can name the file and
the line (text files) or row (Parquet, 1-based) of a bad record.

Layouts (``path`` is the dataset folder from config.yaml; any text file may also be gzipped, ``.gz``):

* ``beir``: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``, ``text``),
  ``qrels/<split>.tsv`` (header line, then ``query-id corpus-id score``).
* ``msmarco``: ``collection.tsv`` (``pid<TAB>text``), optional ``titles.tsv`` (``pid<TAB>title``),
  ``queries.<split>.tsv`` (``qid<TAB>text``), ``qrels.<split>.tsv`` (TREC: ``qid 0 pid relevance``; a split's
  files may have other names, ``split_files``: e.g. TREC DL's ``msmarco-test2019-queries.tsv`` and
  ``2019qrels-pass.txt``, graded 0-3),
  and optionally the official BM25 negatives: ``qid<TAB>pid,pid,...`` (Tevatron/RocketQA
  ``train.negatives.tsv``) or ``qid<TAB>positive pid<TAB>negative pid`` (``qidpidtriples.train.full.2.tsv``).
* ``parquet``: ``corpus.parquet`` (``doc_id``, ``text``, optional ``title``), ``queries_<split>.parquet``
  or (when there is none) ``queries.parquet`` (``query_id``, ``text``), ``qrels_<split>.parquet`` (``query_id``, ``doc_id``,
  ``relevance``).
* ``dpr`` (DPR's open-domain QA releases: Natural Questions, TriviaQA, ...): ``psgs_w100.tsv`` (header
  ``id<TAB>text<TAB>title``, read like DPR with ``csv`` and a tab delimiter), and per split either a DPR
  bi-encoder JSON (``biencoder-nq-train.json``: a list of ``{question, answers, positive_ctxs,
  hard_negative_ctxs, ...}``, each context with ``passage_id`` or ``psg_id``) or a QA file
  (``nq-test.qa.csv``: ``question<TAB>["answer", ...]``, no header). A split's file is named by
  ``split_files: {split: {queries: name}}``, else ``<split>.json`` or ``<split>.qa.csv``. Questions have no
  ids in these files; a question's id is its 0-based position in its file (Pyserini's ids for DPR topics).
  Positives come from ``positive_ctxs``; ``hard_negative_ctxs`` (DPR's BM25 negatives) are the official
  negatives when ``official_negatives`` names the train JSON.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq

from ..errors import DataError
from .dpr_files import DPR_PASSAGES, dpr_documents, dpr_questions, dpr_split_name, read_dpr_questions
from .records import Document, Judgement, Location, NegativeList, Query, as_relevance, as_text
from .text_files import dataset_folder, iter_json_lines, iter_lines, iter_tsv, resolve_file

FORMATS = ("beir", "msmarco", "parquet", "dpr")
log = logging.getLogger(__name__)


def _parquet_rows(path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> Iterator[
        tuple[Location, dict]]:
    if not path.is_file():
        raise DataError(path, "Parquet file not found", "check the dataset's `path` in config.yaml")
    log.info("reading %s", path)
    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataError(path, f"not a readable Parquet file ({err})", "rewrite the file with pandas "
                        "`to_parquet` or pyarrow") from None
    names = parquet.schema_arrow.names
    missing = [c for c in required if c not in names]
    if missing:
        raise DataError(path, f"missing column(s) {', '.join(map(repr, missing))} (has {names})",
                        f"give the file the columns {', '.join(required)}")
    columns = list(required) + [c for c in optional if c in names]
    row = 0
    for batch in parquet.iter_batches(columns=columns, batch_size=65536):
        for record in batch.to_pylist():
            row += 1
            yield Location(path, row=row), record


def _parquet_documents(path: Path) -> Iterator[Document]:
    for where, rec in _parquet_rows(path, ("doc_id", "text"), ("title",)):
        yield Document(where, as_text(rec["doc_id"], where, "doc_id"), as_text(rec.get("title"), where,
                       "title"), as_text(rec["text"], where, "text"))


def _parquet_queries(path: Path) -> Iterator[Query]:
    for where, rec in _parquet_rows(path, ("query_id", "text")):
        yield Query(where, as_text(rec["query_id"], where, "query_id"), as_text(rec["text"], where, "text"))


def _parquet_judgements(path: Path) -> Iterator[Judgement]:
    for where, rec in _parquet_rows(path, ("query_id", "doc_id", "relevance")):
        yield Judgement(where, as_text(rec["query_id"], where, "query_id"),
                        as_text(rec["doc_id"], where, "doc_id"), as_relevance(str(rec["relevance"]), where))


# ------------------------------------------------------------------------------------------------ beir
def _beir_documents(root: Path) -> Iterator[Document]:
    path = resolve_file(root / "corpus.jsonl", "BEIR corpus")
    for line, rec in iter_json_lines(path, ("_id", "text")):
        where = Location(path, line)
        yield Document(where, as_text(rec["_id"], where, "_id"), as_text(rec.get("title"), where, "title"),
                       as_text(rec["text"], where, "text"))


def _beir_queries(root: Path) -> Iterator[Query]:
    path = resolve_file(root / "queries.jsonl", "BEIR queries")
    for line, rec in iter_json_lines(path, ("_id", "text")):
        where = Location(path, line)
        yield Query(where, as_text(rec["_id"], where, "_id"), as_text(rec["text"], where, "text"))


def _beir_judgements(root: Path, split: str) -> Iterator[Judgement]:
    path = resolve_file(root / "qrels" / f"{split}.tsv", f"BEIR qrels for split {split!r}")
    for line, (qid, did, score) in iter_tsv(path, ("query-id", "corpus-id", "score"), header=True):
        where = Location(path, line)
        yield Judgement(where, qid, did, as_relevance(score, where))


# --------------------------------------------------------------------------------------------- msmarco
def _msmarco_documents(root: Path) -> Iterator[Document]:
    titles: dict[str, str] = {}
    titles_file = root / "titles.tsv"
    if titles_file.exists() or titles_file.with_name("titles.tsv.gz").exists():
        titles_file = resolve_file(titles_file, "MS MARCO titles")
        titles = {pid: title for _, (pid, title) in iter_tsv(titles_file, ("pid", "title"))}
    path = resolve_file(root / "collection.tsv", "MS MARCO collection")
    for line, (pid, text) in iter_tsv(path, ("pid", "text")):
        yield Document(Location(path, line), pid, titles.get(pid, ""), text)


def _split_file(split: str, files: dict | None, kind: str) -> str:
    """A msmarco split's queries or qrels file name: ``files[kind]`` when given (``split_files``), else the
    layout's ``queries.<split>.tsv`` / ``qrels.<split>.tsv``."""
    return (files or {}).get(kind) or f"{kind}.{split}.tsv"


def _msmarco_queries(root: Path, split: str, files: dict | None = None) -> Iterator[Query]:
    path = resolve_file(root / _split_file(split, files, "queries"), f"MS MARCO queries for split {split!r}")
    for line, (qid, text) in iter_tsv(path, ("qid", "text")):
        yield Query(Location(path, line), qid, text)


def _msmarco_judgements(root: Path, split: str, files: dict | None = None) -> Iterator[Judgement]:
    path = resolve_file(root / _split_file(split, files, "qrels"), f"MS MARCO qrels for split {split!r}")
    for line, (qid, _iteration, pid, rel) in iter_tsv(path, ("qid", "iteration", "pid", "relevance"),
                                                       whitespace=True):
        where = Location(path, line)
        yield Judgement(where, qid, pid, as_relevance(rel, where))


def read_official_negatives(path: str | Path) -> Iterator[NegativeList]:
    """The official MS MARCO BM25 negatives: ``qid<TAB>pid,pid,...`` or ``qid<TAB>pos<TAB>neg`` triples.

    The layout is decided by the first line; triples of one query are grouped (in file order).
    """
    path = resolve_file(path, "official negatives")
    if ".json" in path.suffixes:  # DPR's bi-encoder train JSON: hard_negative_ctxs are its BM25 negatives
        for question in read_dpr_questions(path):
            yield NegativeList(question.where, question.query_id, question.hard_negative_ids)
        return
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        raise DataError(path, "the file is empty", "give the official negatives file or remove "
                        "`official_negatives` from the dataset's config")
    columns = len(first[1].split("\t"))
    if columns == 2:
        for line, (qid, pids) in iter_tsv(path, ("qid", "comma-separated negative pids")):
            yield NegativeList(Location(path, line), qid, [p for p in pids.split(",") if p])
    elif columns == 3:
        current: NegativeList | None = None
        for line, (qid, _positive, negative) in iter_tsv(path, ("qid", "positive pid", "negative pid")):
            if current is not None and current.query_id != qid:
                yield current
                current = None
            if current is None:
                current = NegativeList(Location(path, line), qid, [])
            if negative not in current.doc_ids:
                current.doc_ids.append(negative)
        if current is not None:
            yield current
    else:
        raise DataError(path, f"{columns} tab-separated columns, expected 2 (qid, pids) or 3 (qid, "
                        "positive pid, negative pid)", "give train.negatives.tsv or qidpidtriples", line=first[0])


# ------------------------------------------------------------------------------------------------- dpr
def read_documents(fmt: str, root: str | Path) -> Iterator[Document]:
    root = dataset_folder(root)
    if fmt == "beir":
        return _beir_documents(root)
    if fmt == "msmarco":
        return _msmarco_documents(root)
    if fmt == "parquet":
        return _parquet_documents(root / "corpus.parquet")
    if fmt == "dpr":
        return dpr_documents(root)
    raise ValueError(f"unknown dataset format {fmt!r}; expected one of {FORMATS}")


def _check_split_files(fmt: str, files: dict | None) -> None:
    if files and fmt not in ("msmarco", "dpr"):
        raise ValueError(f"split_files is only for the msmarco and dpr layouts, the dataset is {fmt!r}")
    if files and fmt == "dpr" and set(files) - {"queries"}:
        raise ValueError("split_files of a dpr dataset name only `queries` (the split's JSON or .qa.csv file)")


def read_queries(fmt: str, root: str | Path, split: str, files: dict | None = None) -> Iterator[Query]:
    """All queries the layout offers for ``split`` (BEIR keeps every split's queries in one file).

    ``files``: the split's ``{"queries": name, "qrels": name}`` when they differ from the layout's (msmarco)."""
    root = dataset_folder(root)
    _check_split_files(fmt, files)
    if fmt == "beir":
        return _beir_queries(root)
    if fmt == "msmarco":
        return _msmarco_queries(root, split, files)
    if fmt == "parquet":
        per_split = root / f"queries_{split}.parquet"
        return _parquet_queries(per_split if per_split.is_file() else root / "queries.parquet")
    if fmt == "dpr":
        return (Query(q.where, q.query_id, q.text) for q in dpr_questions(root, split, files))
    raise ValueError(f"unknown dataset format {fmt!r}; expected one of {FORMATS}")


def read_judgements(fmt: str, root: str | Path, split: str, files: dict | None = None) -> Iterator[Judgement]:
    root = dataset_folder(root)
    _check_split_files(fmt, files)
    if fmt == "beir":
        return _beir_judgements(root, split)
    if fmt == "msmarco":
        return _msmarco_judgements(root, split, files)
    if fmt == "parquet":
        return _parquet_judgements(root / f"qrels_{split}.parquet")
    if fmt == "dpr":
        return (Judgement(q.where, q.query_id, pid, 1) for q in dpr_questions(root, split, files)
                for pid in q.positive_ids)
    raise ValueError(f"unknown dataset format {fmt!r}; expected one of {FORMATS}")


def raw_files(fmt: str, root: str | Path, split: str | None = None, files: dict | None = None) -> list[Path]:
    """The raw files a layout reads for the corpus (``split=None``) or a split, for Snakemake's inputs.

    A file that exists only gzipped is named with ``.gz``; a missing file keeps its plain name, so
    Snakemake reports it as missing input. A ``root`` that is a file is a DataError (:func:`dataset_folder`).
    """
    root = dataset_folder(root)
    if split is None:
        names = {"beir": ["corpus.jsonl"], "msmarco": ["collection.tsv"], "parquet": ["corpus.parquet"],
                 "dpr": [DPR_PASSAGES]}[fmt]
        if fmt == "msmarco" and any((root / n).exists() for n in ("titles.tsv", "titles.tsv.gz")):
            names.append("titles.tsv")
    else:
        names = {"beir": ["queries.jsonl", f"qrels/{split}.tsv"],
                 "msmarco": [_split_file(split, files, "queries"), _split_file(split, files, "qrels")],
                 "parquet": [f"queries_{split}.parquet" if (root / f"queries_{split}.parquet").exists()
                             else "queries.parquet", f"qrels_{split}.parquet"],
                 "dpr": [dpr_split_name(root, split, files)]}[fmt]
    found = []
    for name in names:
        plain = root / name
        gz = plain.with_name(plain.name + ".gz")
        found.append(gz if not plain.exists() and gz.exists() else plain)
    return found
