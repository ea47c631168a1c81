"""TREC run files: ``query_id Q0 doc_id rank score tag``, one line per retrieved document."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.ids import id_problem
from dpr_pipeline.data.text_files import iter_tsv
from dpr_pipeline.errors import DataError

RUN_COLUMNS = ("query_id", "Q0", "doc_id", "rank", "score", "tag")


def rank_order(hits: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """``(doc_id, score)`` hits in rank order: score descending, equal scores by doc id (ascending).

    A searcher's own order of tied hits is an accident of its device (faiss on a GPU returns them in another
    order than on a CPU) or of its index layout; ordering ties by doc id makes a run the same wherever it is
    computed. Every run the pipeline writes (BM25, dense, re-ranked) goes through here."""
    return sorted(hits, key=lambda hit: (-hit[1], hit[0]))


def write_trec_run(results: Iterable[tuple[str, list[tuple[str, float]]]], path: str | Path, tag: str) -> None:
    """Write ``(query_id, [(doc_id, score), ...])`` pairs atomically, each query's hits in :func:`rank_order`
    (score descending, ties by doc id), ranked 1, 2, … in that order.

    An id or tag that is empty or holds whitespace or a control character would make a corrupt line: it is a
    DataError naming the run and the line it would have been, and nothing is written."""
    _check_field(tag, "tag", path, None)
    line = 0
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for query_id, hits in results:
            _check_field(query_id, "query id", path, line + 1)
            for rank, (doc_id, score) in enumerate(rank_order(hits), start=1):
                line += 1
                _check_field(doc_id, f"document id (query {query_id!r})", path, line)
                out.write(f"{query_id} Q0 {doc_id} {rank} {score:.6f} {tag}\n")


def append_tail(reranked: list[tuple[str, float]], tail: list[str]) -> list[tuple[str, float]]:
    """The re-ranked hits (sorted by score), then the first stage's remaining hits in their order, scored
    ``lowest re-ranked score − 1, − 2, …``: below every re-ranked hit and without ties, so every evaluation
    tool ranks them as written."""
    lowest = min((score for _, score in reranked), default=0.0)
    return reranked + [(doc_id, lowest - rank) for rank, doc_id in enumerate(tail, start=1)]


def _check_field(value, what: str, path, line: int | None) -> None:
    problem = "is empty" if not str(value) else id_problem(str(value))
    if problem:
        raise DataError(path, f"refusing to write {what} {str(value)!r}: it {problem}, which would corrupt the "
                        "run's whitespace-separated columns", "fix the id where it enters (the raw corpus, queries "
                        "or qrels file: ingestion refuses such ids) and rerun from ingestion", line=line)


def read_trec_run(path: str | Path) -> pd.DataFrame:
    """Read a TREC run into a frame (query_id, doc_id, rank, score), sorted by query and rank."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "run file not found", "run the Snakemake rule that writes it")
    rows = []
    for line, (qid, _q0, did, rank, score, _tag) in iter_tsv(path, RUN_COLUMNS, whitespace=True):
        try:
            rows.append((qid, did, int(rank), float(score)))
        except ValueError:
            raise DataError(path, f"rank {rank!r} or score {score!r} is not a number",
                            "write integer ranks and numeric scores", line=line) from None
    frame = pd.DataFrame(rows, columns=["query_id", "doc_id", "rank", "score"])
    duplicated = frame.duplicated(["query_id", "doc_id"])
    if duplicated.any():
        first = frame[duplicated].iloc[0]
        raise DataError(path, f"document {first.doc_id!r} is listed twice for query {first.query_id!r}",
                        "list each document at most once per query",
                        line=_second_listing(path, first.query_id, first.doc_id))
    return frame.sort_values(["query_id", "rank"], kind="stable").reset_index(drop=True)


def _second_listing(path: Path, query_id: str, doc_id: str) -> int | None:
    """The line that lists ``doc_id`` for ``query_id`` a second time (found again only when there is an error)."""
    seen = False
    for line, fields in iter_tsv(path, RUN_COLUMNS, whitespace=True):
        if fields[0] == query_id and fields[2] == doc_id:
            if seen:
                return line
            seen = True
    return None
