"""Training examples from a negatives artifact: per query, one positive and ``n`` negatives drawn each epoch.

Every fine-tuning stage trains on groups [d⁺, n₁ … n_n] built here: the retrievers (Eq. 3), the re-ranker
(Eq. 4) and the distilled retriever (Eq. 5, with the teacher's scores of the same passages). The draw depends
only on (seed, query id, epoch), so a resumed run sees the same groups as an uninterrupted one.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ..data.schemas import read_artifact
from ..errors import DataError
from ..models import passage_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Group:
    query: str
    passages: list[str]                 # positive first, then the negatives
    passage_ids: list[str]
    scores: list[float] | None = None   # the artifact's score of each passage (teacher scores), if asked for


def check_negatives_known(rows: pd.DataFrame, path: str | Path, passages: dict[str, str],
                          queries: dict[str, str], first_row: int = 1) -> None:
    """Raise a DataError naming the row (``first_row`` = the file row of ``rows``' first) of a negatives
    artifact whose query is not in ``queries`` or whose positive or negative is not in ``passages``."""
    for row, (qid, positives, negatives) in enumerate(
            zip(rows["query_id"], rows["positive_ids"], rows["negative_ids"]), start=first_row):
        if qid not in queries:
            raise DataError(path, f"query {qid!r} is not in the queries artifact",
                            "build the negatives from the same dataset's train split", row=row)
        missing = next((d for d in (*positives, *negatives) if d not in passages), None)
        if missing is not None:
            raise DataError(path, f"document {missing!r} is not in the corpus",
                            "build the negatives from the same dataset's corpus", row=row)


def read_texts(corpus_path, queries_path) -> tuple[dict[str, str], dict[str, str]]:
    """Passage strings by doc id and query strings by query id, read from the corpus and queries artifacts."""
    corpus = read_artifact(corpus_path, "corpus")
    queries = read_artifact(queries_path, "queries")
    passages = {d: passage_text(t, x) for d, t, x in zip(corpus["doc_id"], corpus["title"], corpus["text"])}
    return passages, dict(zip(queries["query_id"], queries["text"]))


class QueryGroups:
    """Per train query of a negatives artifact: its text, a positive and ``negatives_per_query`` negatives.

    The positive is drawn among the query's positives, the negatives without replacement from its pool (with
    replacement when the pool is smaller than ``negatives_per_query``). Queries without any negative are left
    out (logged). With ``with_scores`` every group carries the artifact's scores, which must all be known.
    """

    def __init__(self, negatives: pd.DataFrame, passages: dict[str, str], queries: dict[str, str],
                 negatives_per_query: int, seed: int, *, with_scores: bool = False, source: str = "negatives"):
        self.negatives_per_query = negatives_per_query
        self.seed = seed
        self.with_scores = with_scores
        self.passages = passages
        check_negatives_known(negatives, source, passages, queries)
        keep = negatives["negative_ids"].map(len) > 0
        if (~keep).any():
            log.warning("%d of %d queries in %s have no negative and are left out", int((~keep).sum()),
                        len(negatives), source)
        self.rows = negatives[keep].reset_index(drop=True)
        if with_scores:
            for row, (ps, ns) in enumerate(zip(negatives["positive_scores"], negatives["negative_scores"]), 1):
                if np.isnan(np.asarray(ps, dtype=float)).any() or np.isnan(np.asarray(ns, dtype=float)).any():
                    raise DataError(source, "a positive or negative without a score",
                                    "score every pair with the teacher (teacher_scores rule)", row=row)
        self.query_texts = [queries[q] for q in self.rows["query_id"]]

    def __len__(self) -> int:
        return len(self.rows)

    def _rng(self, index: int, epoch: int) -> np.random.Generator:
        query_id = self.rows["query_id"].iat[index]
        return np.random.default_rng([self.seed, zlib.crc32(query_id.encode("utf-8")), epoch])

    def example(self, index: int, epoch: int) -> Group:
        rng = self._rng(index, epoch)
        positives: Sequence[str] = self.rows["positive_ids"].iat[index]
        negatives: Sequence[str] = self.rows["negative_ids"].iat[index]
        p = int(rng.integers(len(positives)))
        n = self.negatives_per_query
        chosen = rng.choice(len(negatives), size=n, replace=len(negatives) < n) if n else np.array([], int)
        ids = [positives[p]] + [negatives[i] for i in chosen]
        scores = None
        if self.with_scores:
            scores = [float(self.rows["positive_scores"].iat[index][p])] + \
                     [float(self.rows["negative_scores"].iat[index][i]) for i in chosen]
        return Group(self.query_texts[index], [self.passages[d] for d in ids], ids, scores)
