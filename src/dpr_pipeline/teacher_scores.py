"""Teacher scores for distillation (Eq. 5): the re-ranker's θ(q, d) (:mod:`.cross_encoder_scoring`) of every
(query, positive) and (query, negative) pair of the negatives artifact.

Sharded: :func:`score_teacher_shard` scores a contiguous slice of the artifact's rows, so a cluster can run every
shard in parallel, and :func:`merge_teacher_shards` concatenates the shards into one negatives artifact.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .cross_encoder_scoring import load_scorer, score_pairs
from .data.corpus_shards import corpus_shard_bounds
from .data.passage_store import PassageStore
from .data.schemas import read_artifact, read_negatives_table, write_artifact
from .errors import DataError
from .training.groups import known_id_lists, read_queries

log = logging.getLogger(__name__)

TEACHER_SOURCE = "teacher"


def shard_slice(num_rows: int, shard: int, num_shards: int) -> slice:
    """Rows of ``shard``: contiguous, sizes differing by at most one, together covering every row in order."""
    return slice(*corpus_shard_bounds(num_rows, shard, num_shards))


def _split_per_row(scores: np.ndarray, counts: list[int]) -> list[list[float]]:
    return [part.tolist() for part in np.split(scores, np.cumsum(counts)[:-1])] if counts else []


def score_teacher_shard(model_dir: str | Path, negatives_path: str | Path, passages_path: str | Path,
                        queries_path: str | Path, output_path: str | Path, *, shard: int, num_shards: int,
                        max_length: int, batch_size: int, bf16: bool = False) -> None:
    """θ of every (query, positive) and (query, negative) pair of one shard's rows, in the negatives schema.

    The shard's rows are written with ``positive_scores``/``negative_scores`` replaced by the teacher's
    scores (an empty shard writes an empty artifact). Passages come from the memory-mapped passage store
    ``passages_path``, so a shard job holds only its own pairs' strings.
    """
    negatives = read_negatives_table(negatives_path)
    rows_slice = shard_slice(negatives.num_rows, shard, num_shards)
    rows = negatives.slice(rows_slice.start, rows_slice.stop - rows_slice.start)
    del negatives
    queries = read_queries(queries_path)
    store = PassageStore.open(passages_path)
    positives, pool = known_id_lists(rows, store, queries, negatives_path, first_row=rows_slice.start + 1)
    query_ids = rows.column("query_id").to_pylist()
    positive_counts, negative_counts = positives.lengths().tolist(), pool.lengths().tolist()
    pair_rows = [part for i in range(len(query_ids)) for part in
                 (positives.rows[positives.offsets[i]:positives.offsets[i + 1]],
                  pool.rows[pool.offsets[i]:pool.offsets[i + 1]])]
    query_texts = [queries[q] for q, p, n in zip(query_ids, positive_counts, negative_counts) for _ in range(p + n)]
    passage_texts = store.passages(np.concatenate(pair_rows) if pair_rows else np.array([], np.int64))
    log.info("teacher shard %d of %d: rows %d–%d, %d pairs", shard, num_shards, rows_slice.start,
             rows_slice.stop, len(query_texts))
    model, tokenizer = load_scorer(model_dir)
    scores = score_pairs(model, tokenizer, query_texts, passage_texts, max_length=max_length,
                         batch_size=batch_size, description=f"teacher shard {shard}", bf16=bf16)
    per_row = _split_per_row(scores, [p + n for p, n in zip(positive_counts, negative_counts)])
    frame = rows.to_pandas()
    scored = frame.assign(  # object columns, so that an empty shard keeps list-typed score columns
        positive_scores=pd.Series([s[:p] for s, p in zip(per_row, positive_counts)], index=frame.index, dtype=object),
        negative_scores=pd.Series([s[p:] for s, p in zip(per_row, positive_counts)], index=frame.index, dtype=object))
    write_artifact(scored, output_path, "negatives",
                   metadata={"source": TEACHER_SOURCE, "teacher": str(model_dir), "shard": str(shard),
                             "num_shards": str(num_shards)})


def _check_scores_finite(frame: pd.DataFrame, path: str | Path) -> None:
    for row, (positive_scores, negative_scores) in enumerate(
            zip(frame["positive_scores"], frame["negative_scores"]), start=1):
        if not np.isfinite(np.asarray([*positive_scores, *negative_scores], dtype=np.float64)).all():
            raise DataError(path, "a teacher score is missing (NaN) or infinite",
                            "delete this shard and rerun its teacher_scores job", row=row)


def merge_teacher_shards(shard_paths: Sequence[str | Path], output_path: str | Path) -> None:
    """Concatenate teacher shards in order into one negatives artifact, after checking every score and query id."""
    if not shard_paths:
        raise ValueError("merge_teacher_shards needs at least one shard")
    frames, first_shard_of = [], {}
    for path in shard_paths:
        frame = read_artifact(path, "negatives")
        _check_scores_finite(frame, path)
        for row, qid in enumerate(frame["query_id"], start=1):
            if qid in first_shard_of:
                raise DataError(path, f"query {qid!r} is also in shard {first_shard_of[qid]}",
                                "score every shard from the same negatives artifact and number of shards", row=row)
            first_shard_of[qid] = str(path)
        frames.append(frame)
    merged = pd.concat(frames, ignore_index=True)
    write_artifact(merged, output_path, "negatives",
                   metadata={"source": TEACHER_SOURCE, "shards": str(len(shard_paths))})
    log.info("teacher scores of %d queries from %d shards written to %s", len(merged), len(shard_paths),
             output_path)
