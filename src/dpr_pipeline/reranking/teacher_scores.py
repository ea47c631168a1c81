"""Teacher scores for distillation (Eq. 5): the re-ranker's θ(q, d) (:mod:`dpr_pipeline.models.pair_scoring`) of the
(query, positive) and (query, negative) pairs of the negatives artifact that the distilled retriever draws
(``stages.reranker.teacher_pairs: drawn``; ``all``: every pair). The student samples its negatives from a
pool by (seed, query, epoch) alone (:mod:`dpr_pipeline.training.groups`), so the pairs it will read are known
before it trains: one epoch of 7 negatives from Retriever2's 15 reads about half the pool, and the teacher's
time with it.

Sharded: :func:`score_teacher_shard` scores a contiguous slice of the artifact's rows, so a cluster can run every
shard in parallel, and :func:`merge_score_shards` concatenates the shards into one negatives artifact (the
denoising scores' shards too, :mod:`dpr_pipeline.reranking.pool_scores`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpr_pipeline.data.corpus_shards import corpus_shard_bounds
from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import open_parquet, read_artifact, read_negatives_table, write_artifact
from dpr_pipeline.errors import DataError
from dpr_pipeline.models.pair_scoring import load_scorer, score_pairs
from dpr_pipeline.training.groups import QueryGroups, known_id_lists, read_queries
from dpr_pipeline.training.schedule import STEP_KEYS, epochs_visited

log = logging.getLogger(__name__)

TEACHER_SOURCE = "teacher"


def shard_slice(num_rows: int, shard: int, num_shards: int) -> slice:
    """Rows of ``shard``: contiguous, sizes differing by at most one, together covering every row in order."""
    return slice(*corpus_shard_bounds(num_rows, shard, num_shards))


def _split_per_row(scores: np.ndarray, counts: list[int]) -> list[list[float]]:
    return [part.tolist() for part in np.split(scores, np.cumsum(counts)[:-1])] if counts else []


def _queries_with_negatives(parquet: pq.ParquetFile) -> int:
    """The whole file's queries with a negative (the student's groups, which set its epochs), read one row group
    at a time: memory of one group's ids whatever the file's size (``iter_batches`` holds more as it goes)."""
    return sum(int(pc.sum(pc.greater(pc.list_value_length(
        parquet.read_row_group(group, columns=["negative_ids"]).column(0)), 0)).as_py() or 0)
        for group in range(parquet.num_row_groups))


def score_teacher_shard(model_dir: str | Path, negatives_path: str | Path, passages_path: str | Path,
                        queries_path: str | Path, output_path: str | Path, *, shard: int, num_shards: int,
                        max_length: int, batch_size: int, bf16: bool = False, draws: dict | None = None) -> None:
    """θ of the (query, positive) and (query, negative) pairs of one shard's rows, in the negatives schema.

    ``draws``: the distilled retriever's sampling settings (``seed``, ``negatives_per_query`` and what sets its
    steps: ``epochs``, ``batch_size``, ``train_steps``, ``min_steps``); only the pairs it draws in the epochs its
    steps reach are scored (:meth:`~dpr_pipeline.training.groups.QueryGroups.drawn`), the others keep no score
    (NaN). None: every pair.

    The shard's rows are written with ``positive_scores``/``negative_scores`` replaced by the teacher's
    scores (an empty shard writes an empty artifact). The job reads only the row groups holding its rows, and
    passages from the memory-mapped passage store ``passages_path``, so it holds only its own pairs' strings.
    """
    parquet = open_parquet(negatives_path, "mined negatives")
    rows_slice = shard_slice(parquet.metadata.num_rows, shard, num_shards)
    rows = read_negatives_table(negatives_path, rows_slice)     # only the row groups of the shard's rows
    queries = read_queries(queries_path)
    store = PassageStore.open(passages_path)
    if draws is None:
        positives, pool = known_id_lists(rows, store, queries, negatives_path, first_row=rows_slice.start + 1)
        drawn_positives, drawn_negatives = np.ones(len(positives.rows), bool), np.ones(len(pool.rows), bool)
        what = "every pair"
    else:
        groups = QueryGroups(rows, store, queries, draws["negatives_per_query"], draws["seed"],
                             source=str(negatives_path), first_row=rows_slice.start + 1)
        epochs = epochs_visited(_queries_with_negatives(parquet),
                                **{key: draws[key] for key in STEP_KEYS if key in draws})
        positives, pool = groups.positive_ids, groups.negative_ids
        drawn_positives, drawn_negatives = groups.drawn(epochs)
        what = (f"the pairs the distilled retriever draws in its {epochs} epoch(s) (seed {draws['seed']}, "
                f"{draws['negatives_per_query']} negatives per query; the others keep no score)")
    query_ids = rows.column("query_id").to_pylist()
    positive_counts, negative_counts = positives.lengths().tolist(), pool.lengths().tolist()
    parts = [(ids.rows[ids.offsets[i]:ids.offsets[i + 1]], drawn[ids.offsets[i]:ids.offsets[i + 1]])
             for i in range(len(query_ids)) for ids, drawn in ((positives, drawn_positives), (pool, drawn_negatives))]
    pair_rows = np.concatenate([r for r, _ in parts]) if parts else np.array([], np.int64)
    scored = np.concatenate([d for _, d in parts]) if parts else np.array([], bool)
    query_of_pair = np.repeat(np.arange(len(query_ids)), np.add(positive_counts, negative_counts).astype(np.int64))
    log.info("teacher shard %d of %d: rows %d–%d, %d of %d pairs: %s", shard, num_shards, rows_slice.start,
             rows_slice.stop, int(scored.sum()), len(scored), what)
    model, tokenizer = load_scorer(model_dir)
    scores = np.full(len(pair_rows), np.nan, dtype=np.float32)
    scores[scored] = score_pairs(model, tokenizer, [queries[query_ids[i]] for i in query_of_pair[scored]],
                                 store.passages(pair_rows[scored]), max_length=max_length, batch_size=batch_size,
                                 description=f"teacher shard {shard}", bf16=bf16)
    broken = scored & ~np.isfinite(scores)
    if broken.any():
        row = rows_slice.start + int(query_of_pair[np.flatnonzero(broken)[0]]) + 1
        raise FloatingPointError(f"{model_dir}: the teacher gave a non-finite score (NaN or inf) to "
                                 f"{int(broken.sum())} pair(s), the first of row {row} of {negatives_path}. Fix: "
                                 f"score again with the re-ranker's bf16: false, else check the re-ranker")
    per_row = _split_per_row(scores, [p + n for p, n in zip(positive_counts, negative_counts)])
    frame = rows.to_pandas()
    scored_frame = frame.assign(  # object columns, so that an empty shard keeps list-typed score columns
        positive_scores=pd.Series([s[:p] for s, p in zip(per_row, positive_counts)], index=frame.index, dtype=object),
        negative_scores=pd.Series([s[p:] for s, p in zip(per_row, positive_counts)], index=frame.index, dtype=object))
    write_artifact(scored_frame, output_path, "negatives",
                   metadata={"source": TEACHER_SOURCE, "teacher": str(model_dir), "shard": str(shard),
                             "num_shards": str(num_shards), "pairs": "drawn" if draws else "all"})


def _check_scores_finite(frame: pd.DataFrame, path: str | Path) -> None:
    """An infinite score is a DataError naming the row; NaN is a pair the cross-encoder was not asked to score."""
    for row, (positive_scores, negative_scores) in enumerate(
            zip(frame["positive_scores"], frame["negative_scores"]), start=1):
        if np.isinf(np.asarray([*positive_scores, *negative_scores], dtype=np.float64)).any():
            raise DataError(path, "a cross-encoder score is infinite",
                            "delete this shard and rerun the job that scored it", row=row)


def merge_score_shards(shard_paths: Sequence[str | Path], output_path: str | Path,
                       source: str = TEACHER_SOURCE) -> None:
    """Concatenate scored shards (the teacher's, or a mined pool's denoising scores: ``source``) in order into one
    negatives artifact, after checking every score and query id."""
    if not shard_paths:
        raise ValueError("merge_score_shards needs at least one shard")
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
    write_artifact(merged, output_path, "negatives", metadata={"source": source, "shards": str(len(shard_paths))})
    log.info("%s scores of %d queries from %d shards written to %s", source, len(merged), len(shard_paths),
             output_path)
