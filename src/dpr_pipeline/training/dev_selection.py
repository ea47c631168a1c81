"""What a trained bi-encoder stage hands on, chosen on the dev split: the trained model, or the model it started from.

A stage trained on a few hundred queries can end below its start (issue 36: a user's 150 training queries ended
0.015 nDCG@10 below the untrained model). So after training, the job scores both candidates on the dataset's dev
split (``dev_split``, never a test split) exactly as the stage's own dev search will: each dev query (with a
relevant judgement) searched in the whole corpus, passages encoded as the corpus encoding stores them
(``embedding_dtype``), scored in ``metric`` like any run (:func:`dpr_pipeline.evaluation.metrics.per_query_metrics`).
The start's score is its dev run's where the start is a chain stage (the figure the summary shows for it), else its
own whole-corpus search. The stage hands on the trained model when it scores above its start, else the start,
unchanged. The corpus is encoded :data:`CORPUS_CHUNK` passages at a time and each query keeps its running top
``depth``, so memory stays bounded at any corpus size; on MS MARCO this is one more encoding of the 8.8M passages
per trained bi-encoder stage, on the training job's first GPU.

The choice goes to ``dev_selection.json`` beside the model (:mod:`dpr_pipeline.training.selection_record`) with the
paired difference over the dev queries and whether the split resolves it, to the job's log, the model card and the
summary (:func:`~dpr_pipeline.training.selection_record.describe`). The re-ranker's counterpart is
``reranker.fusion_weight: dev`` (weight 0 hands on Retriever2's order;
:func:`dpr_pipeline.reranking.score_fusion.weight_setting`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.metrics import drop_identical_ids, per_query_metrics
from dpr_pipeline.evaluation.paired_difference import paired_difference
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.selection_record import START, TRAINED, choose, describe, scoring, selection_record
from dpr_pipeline.training.settings import BiEncoderSettings, DevSelection, DevSelectionSettings

log = logging.getLogger(__name__)

#: The most passages encoded and scored at a time (fewer where many queries make the score block large).
CORPUS_CHUNK = 65536
#: The most query-passage scores held at a time (256 MB of float32), and the fewest passages a chunk holds.
SCORE_BLOCK = 2 ** 26
MIN_CHUNK = 1024


@dataclass(frozen=True)
class DevQueries:
    """The dev queries with a relevant judgement, their texts and the dev qrels."""

    query_ids: list[str]
    queries: list[str]
    qrels: pd.DataFrame
    source: str  # the qrels file, for messages


def dev_queries(queries_path: str | Path, qrels_path: str | Path) -> DevQueries:
    """The dev queries of ``qrels_path`` with a relevant judgement and a text in ``queries_path``."""
    qrels = read_artifact(qrels_path, "qrels")
    queries = read_artifact(queries_path, "queries")
    texts = dict(zip(queries["query_id"], queries["text"].fillna("")))
    judged = qrels[(qrels["relevance"] > 0) & qrels["query_id"].isin(texts.keys())]
    query_ids = sorted(set(judged["query_id"]))
    if not query_ids:
        raise DataError(qrels_path, "no dev query has a relevant judgement and a text, so nothing can choose "
                                    "between a trained model and its start", "check the dev split's qrels and queries")
    return DevQueries(query_ids, [texts[q] for q in query_ids], qrels[qrels["query_id"].isin(query_ids)],
                      str(qrels_path))


def top_hits(scores: np.ndarray, rows: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ``depth`` highest ``scores`` (one row per query) and their ``rows``, best first."""
    if scores.shape[1] > depth:
        keep = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
        scores, rows = np.take_along_axis(scores, keep, 1), np.take_along_axis(rows, keep, 1)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def corpus_run(encoder, tokenizer, queries: DevQueries, passages: PassageStore, *, depth: int,
               query_max_length: int, passage_max_length: int, batch_size: int, dtype: str = "float32",
               device=None, bf16: bool = False) -> pd.DataFrame:
    """A bi-encoder's run of ``queries`` over every passage of ``passages`` (query_id, doc_id, rank, score): the
    top ``depth`` by dot product, passage vectors rounded to ``dtype`` as the corpus encoding stores them."""
    common = {"batch_size": batch_size, "device": device, "bf16": bf16}
    query_vectors = encode_texts(encoder, tokenizer, queries.queries, max_length=query_max_length,
                                 prompt=encoder.prompts.query, **common)
    chunk = max(MIN_CHUNK, min(CORPUS_CHUNK, SCORE_BLOCK // max(len(query_vectors), 1)))
    best_scores = np.empty((len(query_vectors), 0), dtype=np.float32)
    best_rows = np.empty((len(query_vectors), 0), dtype=np.int64)
    for begin in range(0, len(passages), chunk):
        rows = np.arange(begin, min(begin + chunk, len(passages)))
        vectors = encode_texts(encoder, tokenizer, passages.passages(rows), max_length=passage_max_length,
                               prompt=encoder.prompts.passage, **common).astype(dtype).astype(np.float32)
        scores = np.concatenate([best_scores, query_vectors @ vectors.T], axis=1)
        candidates = np.concatenate([best_rows, np.broadcast_to(rows, (len(query_vectors), len(rows)))], axis=1)
        best_scores, best_rows = top_hits(scores, candidates, depth)
        if len(passages) > chunk:
            log.info("dev selection: %d of %d passages searched", rows[-1] + 1, len(passages))
    found, where = np.unique(best_rows, return_inverse=True)   # the ids of the hits only, not of the whole corpus
    doc_ids = np.asarray(passages.doc_ids(found), dtype=object)
    return pd.DataFrame({"query_id": np.repeat(queries.query_ids, best_rows.shape[1]),
                         "doc_id": doc_ids[where.ravel()],
                         "rank": np.tile(np.arange(1, best_rows.shape[1] + 1), len(queries.query_ids)),
                         "score": best_scores.ravel().astype(float)})


def run_scores(run: pd.DataFrame, queries: DevQueries, chosen: DevSelectionSettings) -> dict[str, float]:
    """``{query_id: metric}`` of a dev run, as the evaluation scores it (identical ids dropped where the dataset
    says so)."""
    if chosen.ignore_identical_ids:
        run = drop_identical_ids(run)
    table = per_query_metrics(run, queries.qrels, [chosen.metric], queries.source, chosen.relevance_level)
    return {str(query): float(value) for query, value in table[chosen.metric].items()}


def select(trained_encoder, load_start: Callable[[], object], tokenizer, passages: PassageStore,
           settings: BiEncoderSettings, selection: DevSelection, *, device=None) -> tuple[object, dict]:
    """The encoder a bi-encoder stage hands on, and its dev_selection.json record.

    ``selection``: the job's settings (:func:`dpr_pipeline.orchestration.stage_settings.selection`) and files, the
    dev split's ``queries`` and ``qrels`` and, where the start is a chain stage's model, that stage's dev run
    (``start_run``); ``load_start``: the model the stage started from, loaded as training loaded it (only where it
    is searched, or handed on); ``settings``: the stage's (``plm``, the max lengths, ``bf16``); ``passages``: the
    whole corpus."""
    chosen, files = selection.settings, selection.files
    named = {"label": chosen.label, "start_label": chosen.start_label, "start_model": settings.plm}
    if chosen.split is None:
        record = selection_record(**named, handed_on=TRAINED, reason=chosen.reason)
        log.warning("%s", describe(record))
        return trained_encoder, record
    queries = dev_queries(files.queries, files.qrels)

    def searched(encoder) -> dict[str, float]:
        run = corpus_run(encoder, tokenizer, queries, passages, depth=chosen.depth,
                         query_max_length=settings.query_max_length,
                         passage_max_length=settings.passage_max_length, batch_size=chosen.encode_batch_size,
                         dtype=chosen.embedding_dtype, device=device, bf16=settings.training.bf16)
        return run_scores(run, queries, chosen)

    trained = searched(trained_encoder)
    start_encoder = None
    if files.start_run:
        start = run_scores(read_trec_run(files.start_run), queries, chosen)
        start_from = f"its dev run {files.start_run}"
    else:
        start_encoder = load_start()
        start, start_from = searched(start_encoder), "searching the whole corpus"
    difference = paired_difference(trained, start) if len(trained) > 1 else None
    trained_score, start_score = float(np.mean(list(trained.values()))), float(np.mean(list(start.values())))
    handed_on = choose(trained_score, start_score)
    record = selection_record(**named, handed_on=handed_on, settings=scoring(chosen, settings),
                              trained=trained_score, start=start_score, queries=len(queries.query_ids),
                              passages=len(passages), paired=difference, start_score_from=start_from)
    (log.warning if handed_on == START else log.info)("%s", describe(record))
    if handed_on == TRAINED:
        return trained_encoder, record
    return (start_encoder if start_encoder is not None else load_start()), record
