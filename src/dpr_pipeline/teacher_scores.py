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
from .data.corpus_shards import corpus_shard_bounds, iter_corpus_rows, open_corpus
from .data.schemas import read_artifact, write_artifact
from .errors import DataError
from .models import passage_text
from .training.groups import check_negatives_known

log = logging.getLogger(__name__)

TEACHER_SOURCE = "teacher"


def shard_slice(num_rows: int, shard: int, num_shards: int) -> slice:
    """Rows of ``shard``: contiguous, sizes differing by at most one, together covering every row in order."""
    return slice(*corpus_shard_bounds(num_rows, shard, num_shards))


def _split_per_row(scores: np.ndarray, counts: list[int]) -> list[list[float]]:
    return [part.tolist() for part in np.split(scores, np.cumsum(counts)[:-1])] if counts else []


def read_passages(corpus_path: str | Path, doc_ids: set[str]) -> dict[str, str]:
    """Passage strings (``title text``) of ``doc_ids`` only, streamed from the corpus artifact batch by batch,
    so that a teacher shard job's memory follows its shard's passages, not the corpus (8.8M for MS MARCO).
    Ids not in the corpus are simply absent (the caller reports them)."""
    corpus = open_corpus(corpus_path)
    passages: dict[str, str] = {}
    for batch in iter_corpus_rows(corpus, 0, corpus.metadata.num_rows):
        ids = batch.column("doc_id").to_pylist()
        wanted = [i for i, doc_id in enumerate(ids) if doc_id in doc_ids]
        if wanted:
            titles, texts = batch.column("title").to_pylist(), batch.column("text").to_pylist()
            for i in wanted:
                passages[ids[i]] = passage_text(titles[i], texts[i] or "")
    return passages


def score_teacher_shard(model_dir: str | Path, negatives_path: str | Path, corpus_path: str | Path,
                        queries_path: str | Path, output_path: str | Path, *, shard: int, num_shards: int,
                        max_length: int, batch_size: int, bf16: bool = False) -> None:
    """θ of every (query, positive) and (query, negative) pair of one shard's rows, in the negatives schema.

    The shard's rows are written with ``positive_scores``/``negative_scores`` replaced by the teacher's
    scores (an empty shard writes an empty artifact).
    """
    negatives = read_artifact(negatives_path, "negatives")
    rows_slice = shard_slice(len(negatives), shard, num_shards)
    rows = negatives.iloc[rows_slice].reset_index(drop=True)
    del negatives
    needed = {d for ids in (*rows["positive_ids"], *rows["negative_ids"]) for d in ids}
    passages = read_passages(corpus_path, needed)
    query_table = read_artifact(queries_path, "queries")
    queries = dict(zip(query_table["query_id"], query_table["text"]))
    check_negatives_known(rows, negatives_path, passages, queries, first_row=rows_slice.start + 1)
    positive_counts = rows["positive_ids"].map(len).tolist()
    negative_counts = rows["negative_ids"].map(len).tolist()
    query_texts, passage_texts = [], []
    for qid, positives, negs in zip(rows["query_id"], rows["positive_ids"], rows["negative_ids"]):
        query_texts.extend([queries[qid]] * (len(positives) + len(negs)))
        passage_texts.extend(passages[d] for d in (*positives, *negs))
    log.info("teacher shard %d of %d: rows %d–%d, %d pairs", shard, num_shards, rows_slice.start,
             rows_slice.stop, len(query_texts))
    model, tokenizer = load_scorer(model_dir)
    scores = score_pairs(model, tokenizer, query_texts, passage_texts, max_length=max_length,
                         batch_size=batch_size, description=f"teacher shard {shard}", bf16=bf16)
    per_row = _split_per_row(scores, [p + n for p, n in zip(positive_counts, negative_counts)])
    scored = rows.assign(  # object columns, so that an empty shard keeps list-typed score columns
        positive_scores=pd.Series([s[:p] for s, p in zip(per_row, positive_counts)], index=rows.index, dtype=object),
        negative_scores=pd.Series([s[p:] for s, p in zip(per_row, positive_counts)], index=rows.index, dtype=object))
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
