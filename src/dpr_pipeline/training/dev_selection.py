"""What a trained bi-encoder stage hands on, chosen on the dev split: the trained model, or the model it started from.

A stage trained on a few hundred queries can end below its start (issue 36: a user's 150 training queries ended
0.015 nDCG@10 below the untrained model). So after training, the job scores both candidates on the dataset's dev
split (``dev_split``, never a test split) and saves the better one as the stage's model: the trained model when
it scores at least as high as its start, else the start, unchanged.

The score is cheap enough to run inside the training job: each dev query (with a relevant judgement) is searched
in a pool of passages, the union of every dev query's top ``pool_depth`` hits in BM25's dev run and in the start's
own dev run (the chain's: ``start``, Retriever1 or Retriever2, whichever the stage starts from) and their judged
passages, and the run is scored in ``metric`` like any run (:func:`dpr_pipeline.evaluation.metrics.evaluate_run`). The
start's score is its dev run's, the figure the summary shows for it: the pool holds its top hits, so searching the
pool would give the same. The pool holds the passages the start confuses with each query, which the trained model
(fine-tuned from it) mostly still does: a pool of BM25's hits alone missed them and scored a Retriever1 +0.013
above its start on 40 dev queries where the whole corpus put it 0.003 below
(docs/results/small_collection.md). At depth 10 that pool scored both within 0.0001 of the whole corpus there;
on SciFact's 81 dev claims (about 1,100 abstracts, encoded once per stage, 20–40 s on 2 CPU cores) it put the
bundled Retriever2 at 0.7450 where the whole corpus puts it at 0.7328: the trained model's own false hits outside
the pool are missed, so its score is an upper bound and a trained model up to about 0.01 below its start can
still be handed on (the exact reading is the stage's whole-corpus dev run, which comes after this job). A start
that is no chain stage's model is scored on the pool too.

The choice goes to ``dev_selection.json`` beside the model (:mod:`dpr_pipeline.training.selection_record`), to the job's
log, the model
card and the summary (:func:`~dpr_pipeline.training.selection_record.describe`). The re-ranker's counterpart is
``reranker.fusion_weight: dev`` (weight 0
hands on Retriever2's order; :func:`dpr_pipeline.reranking.score_fusion.weight_setting`).
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
from dpr_pipeline.evaluation.metrics import evaluate_run
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.selection_record import START, TRAINED, choose, describe, scoring, selection_record

log = logging.getLogger(__name__)

#: Hits per dev query in a candidate's pool run (more than any cut-off the selection metric reads).
POOL_RUN_DEPTH = 100


@dataclass(frozen=True)
class DevPool:
    """The dev queries (those with a relevant judgement), the pool's passages and the dev qrels."""

    query_ids: list[str]
    queries: list[str]
    doc_ids: list[str]
    passages: list[str]
    qrels: pd.DataFrame
    source: str  # the qrels file, for messages


def dev_pool(queries_path: str | Path, qrels_path: str | Path, run_paths: list[str | Path],
             passages: PassageStore, depth: int) -> DevPool:
    """The pool of :mod:`dev_selection`: the dev queries of ``qrels_path`` with a relevant judgement, searched among
    the union of every dev query's top ``depth`` hits in each run of ``run_paths`` (BM25's, the start's) and their
    judged passages. ``passages``: the corpus's passage store."""
    qrels = read_artifact(qrels_path, "qrels")
    queries = read_artifact(queries_path, "queries")
    texts = dict(zip(queries["query_id"], queries["text"].fillna("")))
    judged = qrels[(qrels["relevance"] > 0) & qrels["query_id"].isin(texts.keys())]
    query_ids = sorted(set(judged["query_id"]))
    if not query_ids:
        raise DataError(qrels_path, "no dev query has a relevant judgement and a text, so nothing can choose "
                                    "between a trained model and its start", "check the dev split's qrels and queries")
    judged_ids = sorted(set(judged["doc_id"]))
    # a judged passage missing from the corpus: not findable
    pooled = {d for d, row in zip(judged_ids, passages.rows_of(judged_ids)) if row >= 0}
    for run_path in run_paths:
        run = read_trec_run(run_path)
        top = run[run["query_id"].isin(query_ids)].groupby("query_id", sort=False).head(depth)
        run_ids = sorted(set(top["doc_id"]))
        unknown = [d for d, row in zip(run_ids, passages.rows_of(run_ids)) if row < 0]
        if unknown:
            raise DataError(run_path, f"document {unknown[0]!r} of the run is not in the corpus",
                            "rerun the run's job on this corpus (its results folder is from another corpus)")
        pooled |= set(top["doc_id"])
    doc_ids = sorted(pooled)
    return DevPool(query_ids, [texts[q] for q in query_ids], doc_ids, passages.passages(passages.rows_of(doc_ids)),
                   qrels[qrels["query_id"].isin(query_ids)], str(qrels_path))


def pool_run(query_vectors: np.ndarray, passage_vectors: np.ndarray, pool: DevPool) -> pd.DataFrame:
    """Each dev query's top :data:`POOL_RUN_DEPTH` pool passages by dot product, as a run (query_id, doc_id,
    rank, score)."""
    scores = query_vectors @ passage_vectors.T
    depth = min(POOL_RUN_DEPTH, scores.shape[1])
    top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
    rows = [(query, pool.doc_ids[column], rank + 1, float(scores[row, column]))
            for row, query in enumerate(pool.query_ids) for rank, column in enumerate(top[row])]
    return pd.DataFrame(rows, columns=["query_id", "doc_id", "rank", "score"])


def pool_score(encoder, tokenizer, pool: DevPool, *, metric: str, relevance_level: int, query_max_length: int,
               passage_max_length: int, batch_size: int, device=None, bf16: bool = False) -> float:
    """``metric`` of a bi-encoder (:class:`~dpr_pipeline.models.embedding.TextEncoder`) searching the pool, each text
    after the encoder's prompt."""
    common = {"batch_size": batch_size, "device": device, "bf16": bf16}
    queries = encode_texts(encoder, tokenizer, pool.queries, max_length=query_max_length,
                           prompt=encoder.prompts.query, **common)
    passages = encode_texts(encoder, tokenizer, pool.passages, max_length=passage_max_length,
                            prompt=encoder.prompts.passage, **common)
    return evaluate_run(pool_run(queries, passages, pool), pool.qrels, [metric], pool.source,
                        relevance_level)[metric]


def select(trained_encoder, load_start: Callable[[], object], tokenizer, passages: PassageStore, params: dict,
           selection: dict, *, device=None) -> tuple[object, dict]:
    """The encoder a bi-encoder stage hands on, and its dev_selection.json record.

    ``selection``: :func:`dpr_pipeline.workflow.stage_settings.selection` with ``files``, the dev split's ``queries``,
    ``qrels``, BM25's ``pool_run`` and, where the start is a chain stage's model, that stage's dev run
    (``start_run``); ``load_start``: the model the stage started from, loaded as training loaded it (only where it
    is scored on the pool, or handed on); ``params``: the stage's (``plm``, the max lengths, ``bf16``)."""
    named = {"label": selection["label"], "start_label": selection["start_label"], "start_model": params["plm"]}
    if selection["split"] is None:
        record = selection_record(**named, handed_on=TRAINED, reason=selection["reason"])
        log.warning("%s", describe(record))
        return trained_encoder, record
    files = selection["files"]
    start_run = files.get("start_run")
    pool = dev_pool(files["queries"], files["qrels"], [files["pool_run"]] + ([start_run] if start_run else []),
                    passages, selection["pool_depth"])

    def score(encoder) -> float:
        return pool_score(encoder, tokenizer, pool, metric=selection["metric"],
                          relevance_level=selection["relevance_level"], query_max_length=params["query_max_length"],
                          passage_max_length=params["passage_max_length"],
                          batch_size=selection["encode_batch_size"], device=device, bf16=params["bf16"])

    trained = score(trained_encoder)
    start_encoder = None
    if start_run:
        start = evaluate_run(read_trec_run(start_run), pool.qrels, [selection["metric"]], pool.source,
                             selection["relevance_level"])[selection["metric"]]
        start_from = f"its dev run {start_run}"
    else:
        start_encoder = load_start()
        start, start_from = score(start_encoder), "searching the pool"
    handed_on = choose(trained, start)
    record = selection_record(**named, handed_on=handed_on, settings=scoring(selection, params), trained=trained,
                              start=start, pool=pool, start_score_from=start_from)
    (log.warning if handed_on == START else log.info)("%s", describe(record))
    if handed_on == TRAINED:
        return trained_encoder, record
    return (start_encoder if start_encoder is not None else load_start()), record
