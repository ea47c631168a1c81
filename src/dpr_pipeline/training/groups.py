"""Training examples from a negatives artifact: per query, one positive and ``n`` negatives drawn each epoch.

Every fine-tuning stage trains on groups [d⁺, n₁ … n_n] built here: the retrievers (Eq. 3), the re-ranker
(Eq. 4) and the distilled retriever (Eq. 5, with the teacher's scores of the same passages). The draw depends
only on (seed, query id, epoch), so a resumed run sees the same groups as an uninterrupted one.

Passages come from the memory-mapped passage store (:mod:`dpr_pipeline.data.passage_store`), shared by the
processes of a node; a query's positives and negatives are kept as store rows (int64 arrays), not strings.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import read_artifact, read_negatives_table
from dpr_pipeline.errors import DataError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Group:
    query: str
    passages: list[str]                 # positive first, then the negatives
    passage_ids: list[str]
    scores: list[float] | None = None   # the artifact's score of each passage (teacher scores), if asked for


def read_queries(path: str | Path) -> dict[str, str]:
    """Query strings by query id, from a queries artifact."""
    queries = read_artifact(path, "queries")
    return dict(zip(queries["query_id"], queries["text"]))


class IdLists:
    """One list column of a negatives table (``positive_ids`` or ``negative_ids``) as store rows: list ``i`` is
    ``rows[offsets[i]:offsets[i + 1]]``; ``unknown``: the first table row (0-based) naming a doc id the store
    lacks, and that id (None when the store has them all)."""

    def __init__(self, column: pa.ChunkedArray, passages: PassageStore):
        lists = column.combine_chunks()
        values = pc.list_flatten(lists)
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy()
        self.offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self.rows = passages.rows_of(values)
        unknown = np.flatnonzero(self.rows < 0)
        self.unknown = None
        if len(unknown):
            parent = pc.list_parent_indices(lists).to_numpy()
            self.unknown = (int(parent[unknown[0]]), values[int(unknown[0])].as_py())

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _scores(column: pa.ChunkedArray) -> np.ndarray:
    return pc.list_flatten(column.combine_chunks()).to_numpy(zero_copy_only=False).astype(np.float64)


def _first_row_with_nan(scores: np.ndarray, offsets: np.ndarray) -> int | None:
    nan = np.flatnonzero(np.isnan(scores))
    return int(np.searchsorted(offsets, nan[0], side="right")) if len(nan) else None  # 1-based


def known_id_lists(negatives: pa.Table, passages: PassageStore, queries: Mapping[str, str], source: str | Path,
                   first_row: int = 1) -> tuple[IdLists, IdLists]:
    """The positives and negatives of a negatives table as store rows, after checking that every query is in
    ``queries`` and every document in ``passages``: else a DataError naming the first bad row (``first_row``: the
    file row of the table's first)."""
    positives, pool = (IdLists(negatives.column(name), passages) for name in ("positive_ids", "negative_ids"))
    problems = []
    unknown_query = next(((row, qid) for row, qid in enumerate(negatives.column("query_id").to_pylist())
                          if qid not in queries), None)
    if unknown_query is not None:
        problems.append((unknown_query[0], 0, f"query {unknown_query[1]!r} is not in the queries artifact",
                         "build the negatives from the same dataset's train split"))
    for order, ids in enumerate((positives, pool), 1):
        if ids.unknown is not None:
            problems.append((ids.unknown[0], order, f"document {ids.unknown[1]!r} is not in the corpus",
                             "build the negatives from the same dataset's corpus"))
    if problems:
        row, _, message, fix = min(problems)
        raise DataError(source, message, fix, row=row + first_row)
    return positives, pool


class QueryGroups:
    """Per train query of a negatives table: its text, a positive and ``negatives_per_query`` negatives.

    The positive is drawn among the query's positives, the negatives without replacement from its pool (with
    replacement when the pool is smaller than ``negatives_per_query``). Queries without any negative are left
    out (logged). With ``with_scores`` every group carries the table's scores (:meth:`check_scores`: those drawn
    must be known). Every query must be in ``queries`` and every passage in ``passages`` (else a DataError naming
    the row).
    """

    def __init__(self, negatives: pa.Table, passages: PassageStore, queries: Mapping[str, str],
                 negatives_per_query: int, seed: int, *, with_scores: bool = False, source: str = "negatives",
                 first_row: int = 1):
        self.negatives_per_query = negatives_per_query
        self.seed = seed
        self.with_scores = with_scores
        self.passages = passages
        query_ids = negatives.column("query_id").to_pylist()
        positives, pool = known_id_lists(negatives, passages, queries, source, first_row)
        self.source = source
        self.positive_scores = self.negative_scores = None
        if with_scores:
            self.positive_scores, self.negative_scores = (_scores(negatives.column("positive_scores")),
                                                          _scores(negatives.column("negative_scores")))
        keep = pool.lengths() > 0
        if not keep.all():
            log.warning("%d of %d queries in %s have no negative and are left out", int((~keep).sum()),
                        len(keep), source)
        self.kept = np.flatnonzero(keep)           # table row of each group
        self.query_ids = [query_ids[i] for i in self.kept]
        self.query_texts = [queries[q] for q in self.query_ids]
        self.positive_ids, self.negative_ids = positives, pool

    def __len__(self) -> int:
        return len(self.kept)

    def _rng(self, index: int, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(self.query_ids[index].encode("utf-8")), epoch])

    def _draw(self, index: int, epoch: int) -> tuple[int, np.ndarray]:
        """Group ``index``'s positive and negatives in ``epoch``, as positions in the flattened positive and negative
        lists of the table."""
        rng = self._rng(index, epoch)
        row = self.kept[index]
        first_positive, first_negative = self.positive_ids.offsets[row], self.negative_ids.offsets[row]
        p = first_positive + int(rng.integers(self.positive_ids.offsets[row + 1] - first_positive))
        pool = self.negative_ids.offsets[row + 1] - first_negative
        n = self.negatives_per_query
        chosen = first_negative + (rng.choice(pool, size=n, replace=pool < n) if n else np.array([], np.int64))
        return p, chosen

    def drawn(self, epochs: int) -> tuple[np.ndarray, np.ndarray]:
        """Which pairs epochs ``0 … epochs - 1`` draw: boolean masks over the table's flattened positive and
        negative lists (a query left out draws none). The teacher scores these pairs alone
        (:mod:`dpr_pipeline.reranking.teacher_scores`), so the distilled retriever reads every score it draws."""
        positives = np.zeros(len(self.positive_ids.rows), dtype=bool)
        negatives = np.zeros(len(self.negative_ids.rows), dtype=bool)
        for index in range(len(self)):
            for epoch in range(epochs):
                p, chosen = self._draw(index, epoch)
                positives[p] = True
                negatives[chosen] = True
        return positives, negatives

    def check_scores(self, epochs: int) -> None:
        """A DataError naming the first table row (1-based) where a pair that epochs ``0 … epochs - 1`` draw has no
        score (NaN); pairs never drawn may have none."""
        positives, negatives = self.drawn(epochs)
        rows = [r for r in (_first_row_with_nan(np.where(positives, self.positive_scores, 0.0),
                                                self.positive_ids.offsets),
                            _first_row_with_nan(np.where(negatives, self.negative_scores, 0.0),
                                                self.negative_ids.offsets)) if r is not None]
        if rows:
            raise DataError(self.source, f"a pair the training draws in its {epochs} epoch(s) has no score",
                            "score the pairs with the teacher for this stage's seed, negatives_per_query and "
                            "epochs (teacher_scores rule; stages.reranker.teacher_pairs: all scores every pair)",
                            row=min(rows))

    def example(self, index: int, epoch: int) -> Group:
        p, chosen = self._draw(index, epoch)
        rows = np.concatenate([[self.positive_ids.rows[p]], self.negative_ids.rows[chosen]])
        scores = None
        if self.with_scores:
            scores = [float(self.positive_scores[p])] + [float(s) for s in self.negative_scores[chosen]]
        return Group(self.query_texts[index], self.passages.passages(rows), self.passages.doc_ids(rows), scores)


def read_query_groups(negatives_path: str | Path, passages_path: str | Path, queries_path: str | Path,
                      negatives_per_query: int, seed: int, *, with_scores: bool = False) -> QueryGroups:
    """The :class:`QueryGroups` of a negatives artifact, its passages from the store file ``passages_path``."""
    return QueryGroups(read_negatives_table(negatives_path), PassageStore.open(passages_path),
                       read_queries(queries_path), negatives_per_query, seed, with_scores=with_scores,
                       source=str(negatives_path))
