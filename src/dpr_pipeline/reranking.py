"""Re-ranking a first-stage TREC run with the re-ranker (:mod:`.cross_encoder_scoring`).

A re-ranked run keeps its tail, as re-ranking toolkits report it: the re-ranked top ``depth`` hits, then the
first stage's remaining hits in their order, scored below every re-ranked hit, so recall at depths beyond the
re-ranked ones is the first stage's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from .cross_encoder_scoring import load_scorer, score_pairs
from .errors import DataError
from .runs import append_tail, read_trec_run, write_trec_run
from .training.groups import read_texts

log = logging.getLogger(__name__)


def _check_run_known(run: pd.DataFrame, run_path: str | Path, passages: dict[str, str], queries: dict[str, str],
                     queries_path: str | Path, corpus_path: str | Path) -> None:
    unknown_query = next((q for q in run["query_id"].unique() if q not in queries), None)
    if unknown_query is not None:
        raise DataError(run_path, f"query {unknown_query!r} is not in the queries artifact {queries_path}",
                        "re-rank a run of the same dataset and split as the queries artifact")
    unknown_doc = next((d for d in run["doc_id"].unique() if d not in passages), None)
    if unknown_doc is not None:
        raise DataError(run_path, f"document {unknown_doc!r} is not in the corpus {corpus_path}",
                        "re-rank a run retrieved from the same dataset's corpus")


def rerank_run(model_dir: str | Path, run_path: str | Path, corpus_path: str | Path, queries_path: str | Path,
               output_run: str | Path, *, depth: int, max_length: int, batch_size: int, tag: str,
               bf16: bool = False) -> None:
    """Re-score each query's top ``depth`` hits of a TREC run with θ(q, d), sorted by θ, followed by the
    query's remaining hits (:func:`~dpr_pipeline.runs.append_tail`).

    Every query of the run must be in the queries artifact and every document in the corpus. Equal θ are
    ordered by doc id (:func:`~dpr_pipeline.runs.rank_order`), as every run the pipeline writes.
    """
    passages, queries = read_texts(corpus_path, queries_path)
    run = read_trec_run(run_path)
    ranked = run.assign(rank=run.groupby("query_id", sort=False).cumcount())
    top = ranked[ranked["rank"] < depth].reset_index(drop=True)
    _check_run_known(top, run_path, passages, queries, queries_path, corpus_path)
    model, tokenizer = load_scorer(model_dir)
    log.info("re-ranking %d hits of %d queries (top %d) from %s", len(top), top["query_id"].nunique(), depth,
             run_path)
    scores = score_pairs(model, tokenizer, [queries[q] for q in top["query_id"]],
                         [passages[d] for d in top["doc_id"]], max_length=max_length, batch_size=batch_size,
                         description="re-ranking", bf16=bf16)
    reranked = top.assign(score=scores).sort_values(["query_id", "score", "doc_id"], ascending=[True, False, True],
                                                    kind="stable")
    tails = {qid: hits["doc_id"].tolist() for qid, hits in ranked[ranked["rank"] >= depth].groupby("query_id")}
    write_trec_run(((qid, append_tail(list(zip(hits["doc_id"], hits["score"].astype(float))), tails.get(qid, [])))
                    for qid, hits in reranked.groupby("query_id", sort=False)), output_run, tag)

