"""The raw dataset layouts, one :class:`DatasetFormat` object each, registered once in :data:`FORMATS`. They only
parse; ``ingest`` checks what they yield.

A format names its files once (:meth:`DatasetFormat.corpus_names`, :meth:`DatasetFormat.split_names`): its readers
open those files and :func:`raw_files` lists the same ones as the Snakemake inputs of the ingestion jobs, so the
files read and the files tracked cannot differ. Every reader yields records that carry their :class:`Location`,
so a later check can name the file and the line (text files) or row (Parquet, 1-based) of a bad record.

Layouts (``path`` is the dataset folder from config.yaml; any text file may also be gzipped, ``.gz``):

* ``beir``: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``, ``text``),
  ``qrels/<split>.tsv`` (header line, then ``query-id corpus-id score``; or TREC qrels, ``query-id iteration
  corpus-id score`` without a header, recognised by the first line: :func:`is_trec_qrels`).
* ``msmarco``: ``collection.tsv`` (``pid<TAB>text``), optional ``titles.tsv`` (``pid<TAB>title``),
  ``queries.<split>.tsv`` (``qid<TAB>text``), ``qrels.<split>.tsv`` (TREC: ``qid 0 pid relevance``; a split's
  files may have other names, ``split_files``: e.g. TREC DL's ``msmarco-test2019-queries.tsv`` and
  ``2019qrels-pass.txt``, graded 0-3),
  and optionally the official BM25 negatives: ``qid<TAB>pid,pid,...`` (Tevatron/RocketQA
  ``train.negatives.tsv``) or ``qid<TAB>positive pid<TAB>negative pid`` (``qidpidtriples.train.full.2.tsv``).
* ``parquet``: ``corpus.parquet`` (``doc_id``, ``text``, optional ``title``), ``queries_<split>.parquet``
  or (when there is none) ``queries.parquet`` (``query_id``, ``text``), ``qrels_<split>.parquet`` (``query_id``,
  ``doc_id``,
  ``relevance``).
* ``dpr`` (DPR's open-domain QA releases: Natural Questions, TriviaQA, ...): ``psgs_w100.tsv`` (header
  ``id<TAB>text<TAB>title``, read like DPR with ``csv`` and a tab delimiter), and per split either a DPR
  bi-encoder JSON (``biencoder-nq-train.json``: a list of ``{question, answers, positive_ctxs,
  hard_negative_ctxs, ...}``, each context with ``passage_id`` or ``psg_id``) or a QA file
  (``nq-test.qa.csv``: ``question<TAB>["answer", ...]``, no header). A split's file is named by
  ``split_files: {split: {queries: name}}``, else ``<split>.json`` or ``<split>.qa.csv``. Questions have no
  ids in these files; a question's id is its 0-based position in its file (Pyserini's ids for DPR topics).
  Positives come from ``positive_ctxs``; ``hard_negative_ctxs`` (DPR's BM25 negatives) are the official
  negatives when ``official_negatives`` names the train JSON. The parsing is in :mod:`.dpr_files`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq

from dpr_pipeline.data.dpr_files import read_dpr_passages, read_dpr_questions
from dpr_pipeline.data.records import (
    Document,
    Judgement,
    Location,
    NegativeList,
    Query,
    Question,
    as_relevance,
    as_text,
)
from dpr_pipeline.data.text_files import (
    ambiguous_files,
    dataset_folder,
    is_integer,
    iter_json_lines,
    iter_lines,
    iter_tsv,
    resolve_file,
)
from dpr_pipeline.errors import DataError

log = logging.getLogger(__name__)


class DatasetFormat(ABC):
    """One raw dataset layout (config ``datasets.<d>.format``): the files it reads and how it reads each.

    ``root`` is the dataset's folder. A format names its files once, by role, relative to ``root``
    (:meth:`corpus_names`, :meth:`split_names`); its readers open :meth:`corpus_paths` / :meth:`split_paths` (a
    text file may also be found gzipped: ``resolve_file``), and :func:`raw_files` lists the same paths."""

    #: The format's name in config.yaml (``datasets.<d>.format``; the schema's enum is tested against FORMATS).
    name: str
    #: The roles of :meth:`split_names` that a dataset's ``split_files`` may rename (none: fixed names).
    renamable: tuple[str, ...] = ()
    #: The split files are questions with their answers (DPR): every question is a query, judged or not; its id is
    #: its position in its file; ``relevance: answers`` is possible; :meth:`questions` reads them.
    question_files: bool = False

    @abstractmethod
    def corpus_names(self, root: Path) -> dict[str, str]:
        """The corpus' files, ``{role: name relative to root}``, in the order Snakemake lists them."""

    @abstractmethod
    def split_names(self, root: Path, split: str) -> dict[str, str]:
        """The files of ``split`` under the layout's own names, ``{role: name relative to root}``."""

    @abstractmethod
    def documents(self, root: Path) -> Iterator[Document]:
        """The corpus' documents, in file order."""

    @abstractmethod
    def queries(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Query]:
        """All queries the layout offers for ``split`` (BEIR keeps every split's queries in one file)."""

    @abstractmethod
    def judgements(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Judgement]:
        """The judgements of ``split``."""

    def corpus_paths(self, root: Path) -> dict[str, Path]:
        return {role: root / name for role, name in self.corpus_names(root).items()}

    def split_paths(self, root: Path, split: str, renamed: dict | None = None) -> dict[str, Path]:
        """:meth:`split_names` as paths, each :attr:`renamable` role renamed by ``renamed`` (the split's entry of
        the dataset's ``split_files``) where it names a file."""
        renamed = renamed or {}
        return {role: root / (renamed.get(role) if role in self.renamable and renamed.get(role) else name)
                for role, name in self.split_names(root, split).items()}


# ------------------------------------------------------------------------------------------------ beir
class BeirFormat(DatasetFormat):
    name = "beir"

    def corpus_names(self, root: Path) -> dict[str, str]:
        return {"corpus": "corpus.jsonl"}

    def split_names(self, root: Path, split: str) -> dict[str, str]:
        return {"queries": "queries.jsonl", "qrels": f"qrels/{split}.tsv"}

    def documents(self, root: Path) -> Iterator[Document]:
        path = resolve_file(self.corpus_paths(root)["corpus"], "BEIR corpus")
        for line, rec in iter_json_lines(path, ("_id", "text")):
            where = Location(path, line)
            yield Document(where, as_text(rec["_id"], where, "_id"), as_text(rec.get("title"), where, "title"),
                           as_text(rec["text"], where, "text"))

    def queries(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Query]:
        path = resolve_file(self.split_paths(root, split, renamed)["queries"], "BEIR queries")
        for line, rec in iter_json_lines(path, ("_id", "text")):
            where = Location(path, line)
            yield Query(where, as_text(rec["_id"], where, "_id"), as_text(rec["text"], where, "text"))

    def judgements(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Judgement]:
        """BEIR's ``query-id<TAB>corpus-id<TAB>score`` after its header line, or, recognised by its first line,
        the TREC qrels format (``query-id iteration corpus-id score``, 4 whitespace-separated columns, no header;
        logged), every line of which is a judgement."""
        path = resolve_file(self.split_paths(root, split, renamed)["qrels"], f"BEIR qrels for split {split!r}")
        if is_trec_qrels(path):
            log.info("%s: TREC qrels format (query-id iteration corpus-id score, whitespace-separated, no header "
                     "line): every line is a judgement", path)
            rows = ((line, (qid, did, score)) for line, (qid, _iteration, did, score)
                    in iter_tsv(path, TREC_QRELS_COLUMNS, whitespace=True))
        else:
            rows = iter_tsv(path, ("query-id", "corpus-id", "score"), header=True)
        for line, (qid, did, score) in rows:
            where = Location(path, line)
            yield Judgement(where, qid, did, as_relevance(score, where))


#: The columns of a TREC qrels line (MS MARCO's qrels, trec_eval's input), whitespace-separated, no header.
TREC_QRELS_COLUMNS = ("query-id", "iteration", "corpus-id", "score")


def is_trec_qrels(path: Path) -> bool:
    """Whether a qrels file is in the TREC format rather than BEIR's: its first line is 4 whitespace-separated
    columns ending in an integer grade (BEIR's header and lines are 3 tab-separated columns)."""
    first = next(iter_lines(path), None)
    if first is None:
        return False
    fields = first[1].split()
    return len(fields) == len(TREC_QRELS_COLUMNS) and is_integer(fields[-1])


# --------------------------------------------------------------------------------------------- msmarco
class MsmarcoFormat(DatasetFormat):
    name = "msmarco"
    renamable = ("queries", "qrels")

    def corpus_names(self, root: Path) -> dict[str, str]:
        titles = "titles.tsv"  # optional: read (and tracked) when it is there
        has_titles = any((root / n).exists() for n in (titles, titles + ".gz"))
        return {"collection": "collection.tsv", **({"titles": titles} if has_titles else {})}

    def split_names(self, root: Path, split: str) -> dict[str, str]:
        return {"queries": f"queries.{split}.tsv", "qrels": f"qrels.{split}.tsv"}

    def documents(self, root: Path) -> Iterator[Document]:
        paths = self.corpus_paths(root)
        titles: dict[str, str] = {}
        if "titles" in paths:
            titles_file = resolve_file(paths["titles"], "MS MARCO titles")
            titles = {pid: title for _, (pid, title) in iter_tsv(titles_file, ("pid", "title"))}
        path = resolve_file(paths["collection"], "MS MARCO collection")
        for line, (pid, text) in iter_tsv(path, ("pid", "text")):
            yield Document(Location(path, line), pid, titles.get(pid, ""), text)

    def queries(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Query]:
        path = resolve_file(self.split_paths(root, split, renamed)["queries"], f"MS MARCO queries for split {split!r}")
        for line, (qid, text) in iter_tsv(path, ("qid", "text")):
            yield Query(Location(path, line), qid, text)

    def judgements(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Judgement]:
        path = resolve_file(self.split_paths(root, split, renamed)["qrels"], f"MS MARCO qrels for split {split!r}")
        for line, (qid, _iteration, pid, rel) in iter_tsv(path, ("qid", "iteration", "pid", "relevance"),
                                                           whitespace=True):
            where = Location(path, line)
            yield Judgement(where, qid, pid, as_relevance(rel, where))


def read_official_negatives(path: str | Path) -> Iterator[NegativeList]:
    """The official BM25 negatives: MS MARCO's ``qid<TAB>pid,pid,...`` or ``qid<TAB>pos<TAB>neg`` triples, or
    DPR's bi-encoder train JSON (its ``hard_negative_ctxs``).

    The layout is decided by the file name (``.json``) and the first line; triples of one query are grouped (in
    file order).
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
                current, listed = NegativeList(Location(path, line), qid, []), set()
            if negative not in listed:   # a set: a list's `in` slowed as a query's triples grew (~1,000 each)
                listed.add(negative)
                current.doc_ids.append(negative)
        if current is not None:
            yield current
    else:
        raise DataError(path, f"{columns} tab-separated columns, expected 2 (qid, pids) or 3 (qid, "
                        "positive pid, negative pid)", "give train.negatives.tsv or qidpidtriples", line=first[0])


# --------------------------------------------------------------------------------------------- parquet
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


class ParquetFormat(DatasetFormat):
    name = "parquet"

    def corpus_names(self, root: Path) -> dict[str, str]:
        return {"corpus": "corpus.parquet"}

    def split_names(self, root: Path, split: str) -> dict[str, str]:
        per_split = f"queries_{split}.parquet"  # the documented order: the split's own file, else the shared one
        return {"queries": per_split if (root / per_split).is_file() else "queries.parquet",
                "qrels": f"qrels_{split}.parquet"}

    def documents(self, root: Path) -> Iterator[Document]:
        for where, rec in _parquet_rows(self.corpus_paths(root)["corpus"], ("doc_id", "text"), ("title",)):
            yield Document(where, as_text(rec["doc_id"], where, "doc_id"), as_text(rec.get("title"), where,
                           "title"), as_text(rec["text"], where, "text"))

    def queries(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Query]:
        for where, rec in _parquet_rows(self.split_paths(root, split, renamed)["queries"], ("query_id", "text")):
            yield Query(where, as_text(rec["query_id"], where, "query_id"), as_text(rec["text"], where, "text"))

    def judgements(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Judgement]:
        path = self.split_paths(root, split, renamed)["qrels"]
        for where, rec in _parquet_rows(path, ("query_id", "doc_id", "relevance")):
            yield Judgement(where, as_text(rec["query_id"], where, "query_id"),
                            as_text(rec["doc_id"], where, "doc_id"), as_relevance(str(rec["relevance"]), where))


# ------------------------------------------------------------------------------------------------- dpr
class DprFormat(DatasetFormat):
    name = "dpr"
    renamable = ("queries",)
    question_files = True
    _SPLIT_FILES = ("{split}.json", "{split}.qa.csv")  # a split's file when split_files names none

    def corpus_names(self, root: Path) -> dict[str, str]:
        return {"passages": "psgs_w100.tsv"}

    def split_names(self, root: Path, split: str) -> dict[str, str]:
        """The split's question file: ``<split>.json`` or ``<split>.qa.csv``, whichever is there (plain or
        ``.gz``; ``.json`` when neither is)."""
        names = [pattern.format(split=split) for pattern in self._SPLIT_FILES]
        found = [n for n in names if any((root / f).exists() for f in (n, n + ".gz"))]
        return {"queries": (found or names)[0]}

    def documents(self, root: Path) -> Iterator[Document]:
        yield from read_dpr_passages(resolve_file(self.corpus_paths(root)["passages"], "DPR passages"))

    def questions(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Question]:
        """The split's questions with their answers (and, from a bi-encoder JSON, positive and hard-negative
        passage ids). Without ``split_files`` two candidate files (``<split>.json`` and ``<split>.qa.csv``) are
        an error naming both."""
        what = f"DPR questions for split {split!r}"
        if not (renamed and renamed.get("queries")):
            bases = [pattern.format(split=split) for pattern in self._SPLIT_FILES]
            found = [root / n for base in bases for n in (base, base + ".gz") if (root / n).is_file()]
            if len(found) > 1:
                raise ambiguous_files(what, found)
        return read_dpr_questions(resolve_file(self.split_paths(root, split, renamed)["queries"], what))

    def queries(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Query]:
        return (Query(q.where, q.query_id, q.text) for q in self.questions(root, split, renamed))

    def judgements(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Judgement]:
        return (Judgement(q.where, q.query_id, pid, 1) for q in self.questions(root, split, renamed)
                for pid in q.positive_ids)


# ------------------------------------------------------------------------------------------- registry
#: Every raw layout by name: the one place a format is registered (tests/test_ingest_formats.py checks the
#: schema's ``datasets.<d>.format`` enum against it).
DPR = DprFormat()
FORMATS: dict[str, DatasetFormat] = {f.name: f for f in (BeirFormat(), MsmarcoFormat(), ParquetFormat(), DPR)}


def reader_of(fmt: str) -> DatasetFormat:
    """The registered format called ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; expected one of {tuple(FORMATS)}")
    return FORMATS[fmt]


def split_files_problem(fmt: str, split_files: dict | None) -> str | None:
    """What is wrong with a dataset's ``split_files`` (``{split: {role: file name}}``) for its format ``fmt``, or
    None: only a format with :attr:`~DatasetFormat.renamable` roles renames files, and only those roles. A format
    without a reader of its own (``ir_datasets``: the workflow writes the exported layout's names) renames none.
    The one check of ``split_files`` (orchestration/config.py calls it at start-up)."""
    if not split_files:
        return None
    renamable = FORMATS[fmt].renamable if fmt in FORMATS else ()
    if not renamable:
        layouts = " and ".join(name for name, layout in FORMATS.items() if layout.renamable)
        return (f"only the {layouts} layouts rename split files, the dataset's format is {fmt!r}; remove "
                "split_files or put the files under the layout's names (docs/datasets.md, Dataset layouts)")
    for split, names in split_files.items():
        other = [role for role in names if role not in renamable]
        if other:
            return (f"split {split!r} renames {', '.join(map(repr, other))}, but a {fmt} dataset renames only "
                    f"{', '.join(map(repr, renamable))} (docs/datasets.md, Dataset layouts); remove "
                    f"{', '.join(map(repr, other))} from split_files.{split}")
    return None


def read_documents(fmt: str, root: str | Path) -> Iterator[Document]:
    return reader_of(fmt).documents(dataset_folder(root))


def read_queries(fmt: str, root: str | Path, split: str, files: dict | None = None) -> Iterator[Query]:
    """All queries the layout offers for ``split``; ``files``: the split's ``split_files`` entry."""
    return reader_of(fmt).queries(dataset_folder(root), split, files)


def read_judgements(fmt: str, root: str | Path, split: str, files: dict | None = None) -> Iterator[Judgement]:
    return reader_of(fmt).judgements(dataset_folder(root), split, files)


def read_answers(root: str | Path, split: str, files: dict | None = None) -> Iterator[Question]:
    """The questions of a ``dpr`` split with their answers (the ``answers_{split}`` artifact's source)."""
    return DPR.questions(dataset_folder(root), split, files)


def raw_files(fmt: str, root: str | Path, split: str | None = None, files: dict | None = None) -> list[Path]:
    """The raw files the format reads for the corpus (``split=None``) or a split, for Snakemake's inputs: the
    reader's own :meth:`~DatasetFormat.corpus_paths` / :meth:`~DatasetFormat.split_paths`.

    A file that exists only gzipped is named with ``.gz``; a missing file keeps its plain name, so
    Snakemake reports it as missing input. A ``root`` that is a file is a DataError (:func:`dataset_folder`).
    """
    return list(raw_paths(fmt, root, split, files).values())


def raw_paths(fmt: str, root: str | Path, split: str | None = None, files: dict | None = None) -> dict[str, Path]:
    """:func:`raw_files` by role (``corpus``, ``queries``, ``qrels``, …, as the format names them)."""
    reader, root = reader_of(fmt), dataset_folder(root)
    paths = reader.corpus_paths(root) if split is None else reader.split_paths(root, split, files)
    found = {}
    for role, plain in paths.items():
        gz = plain.with_name(plain.name + ".gz")
        found[role] = gz if not plain.exists() and gz.exists() else plain
    return found
