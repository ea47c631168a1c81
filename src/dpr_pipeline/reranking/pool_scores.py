"""A cross-encoder's scores of a mined stage's candidate pool, for ``mining.<stage>.denoise`` (RocketQA's
denoising of hard negatives; sentence-transformers' ``mine_hard_negatives(cross_encoder=...)`` rescoring).

A CPU job (rule ``denoise_pool``, :func:`dpr_pipeline.retrieval.negatives.write_denoise_pool`) writes the pool the
stage's mining job builds (:func:`~dpr_pipeline.retrieval.negatives.candidate_pool`: the run's top ``depth`` minus
the positives, or the official negatives) once, in the negatives schema. The GPU jobs of rule ``denoise_scores``
(:func:`write_pool_scores`) each read one contiguous slice of its queries (``denoise.shards`` jobs), score every
(query, positive) and (query, candidate) pair with θ(q, d) (:func:`dpr_pipeline.models.pair_scoring.score_pairs`, as
re-ranking and the teacher scores do) and write them in the negatives schema, merged by
:func:`dpr_pipeline.reranking.teacher_scores.merge_score_shards`. The mining job, a CPU job, reads them back
(:func:`dpr_pipeline.retrieval.negatives.denoise_inputs`) and drops the candidates the cross-encoder scores like
positives (:class:`dpr_pipeline.retrieval.negative_filters.Denoise`). Scores are the raw logit θ; ``denoise.sigmoid``
is applied by the filter, so a threshold change re-runs mining only.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import open_parquet, read_negatives_table, write_artifact
from dpr_pipeline.models.pair_scoring import load_scorer, score_pairs
from dpr_pipeline.reranking.teacher_scores import shard_slice
from dpr_pipeline.training.groups import known_id_lists, read_queries

log = logging.getLogger(__name__)

DENOISE_SOURCE = "denoise"
COLUMNS = ["query_id", "positive_ids", "positive_scores", "negative_ids", "negative_scores"]


#: Pairs tokenized and scored at a time: the passages' strings and tokens of a chunk only are held (an MS MARCO pool
#: of 502k queries x 200 candidates is 100M pairs), and each chunk is still sorted by length for little padding.
CHUNK_PAIRS = 1 << 18


def score_pool(model_dir: str | Path, candidates: pa.Table, passages_path: str | Path,
               queries_path: str | Path, *, source: str, max_length: int, batch_size: int,
               bf16: bool = False, first_row: int = 1) -> pd.DataFrame:
    """``candidates`` (a negatives table, :func:`~dpr_pipeline.data.schemas.read_negatives_table`) as a DataFrame
    with ``positive_scores``/``negative_scores`` replaced by the cross-encoder's θ of each (query, passage) pair:
    every positive, retrieved or not, and every candidate.

    Every query must be in the queries artifact and every passage in the passage store (a DataError naming the
    row of ``source``, the pool's file, counted from ``first_row``, otherwise). Scored :data:`CHUNK_PAIRS` pairs at a
    time."""
    store = PassageStore.open(passages_path)
    queries = read_queries(queries_path)
    positives, pool = known_id_lists(candidates, store, queries, source, first_row=first_row)
    n_pos, counts = positives.lengths(), positives.lengths() + pool.lengths()
    query_ids = candidates.column("query_id").to_pylist()
    query_of_pair = np.repeat(np.arange(len(query_ids)), counts.astype(np.int64))
    pair_rows = np.concatenate([part for i in range(len(query_ids)) for part in
                                (positives.rows[positives.offsets[i]:positives.offsets[i + 1]],
                                 pool.rows[pool.offsets[i]:pool.offsets[i + 1]])] or [np.array([], np.int64)])
    log.info("denoising scores: %d pairs (%d positives, %d candidates) of %d train queries with %s",
             len(pair_rows), int(n_pos.sum()), int(pool.lengths().sum()), len(query_ids), model_dir)
    model, tokenizer = load_scorer(model_dir)
    scores = np.empty(len(pair_rows), dtype=np.float32)
    for start in range(0, len(pair_rows), CHUNK_PAIRS):
        chunk = slice(start, start + CHUNK_PAIRS)
        scores[chunk] = score_pairs(model, tokenizer, [queries[query_ids[i]] for i in query_of_pair[chunk]],
                                    store.passages(pair_rows[chunk]), max_length=max_length, batch_size=batch_size,
                                    description=f"denoising scores from pair {start:,} of {len(pair_rows):,}",
                                    bf16=bf16)
    broken = ~np.isfinite(scores)
    if broken.any():
        row = int(query_of_pair[np.flatnonzero(broken)[0]]) + first_row
        raise FloatingPointError(f"{model_dir}: the cross-encoder gave a non-finite score (NaN or inf) to "
                                 f"{int(broken.sum())} pair(s), the first of row {row} of the pool of {source}. Fix: "
                                 f"set mining.<stage>.denoise.bf16: false, else check the model")
    per_row = np.split(scores, np.cumsum(counts)[:-1]) if len(counts) else []
    return pd.DataFrame({"query_id": query_ids, "positive_ids": candidates.column("positive_ids").to_pylist(),
                         "positive_scores": [s[:p].astype(float).tolist() for s, p in zip(per_row, n_pos)],
                         "negative_ids": candidates.column("negative_ids").to_pylist(),
                         "negative_scores": [s[p:].astype(float).tolist() for s, p in zip(per_row, n_pos)]},
                        columns=COLUMNS)


def write_pool_scores(model_dir: str | Path, pool: str | Path, passages_path: str | Path, queries_path: str | Path,
                      output: str | Path, *, max_length: int, batch_size: int, bf16: bool = False, shard: int = 0,
                      num_shards: int = 1) -> pd.DataFrame:
    """Shard ``shard`` of ``num_shards`` of a mined stage's denoising scores: the shard's contiguous slice of the
    queries of ``pool`` (:func:`~dpr_pipeline.retrieval.negatives.write_denoise_pool`'s artifact), scored by
    :func:`score_pool`."""
    rows = shard_slice(open_parquet(pool, "denoising pool").metadata.num_rows, shard, num_shards)
    candidates = read_negatives_table(pool, rows)       # only the row groups of the shard's rows
    scored = score_pool(model_dir, candidates, passages_path, queries_path, source=str(pool), max_length=max_length,
                        batch_size=batch_size, bf16=bf16, first_row=rows.start + 1)
    write_artifact(scored, output, "negatives",
                   metadata={"source": DENOISE_SOURCE, "cross_encoder": str(model_dir), "shard": str(shard),
                             "num_shards": str(num_shards)})
    return scored
