"""Re-ranking a first-stage TREC run with the re-ranker (:mod:`dpr_pipeline.models.pair_scoring`).

A re-ranked run keeps its tail, as re-ranking toolkits report it: the re-ranked top ``depth`` hits, then the
first stage's remaining hits in their order, scored below every re-ranked hit, so recall at depths beyond the
re-ranked ones is the first stage's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.trec_runs import append_tail, read_trec_run, write_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.models.pair_scoring import load_scorer, score_pairs
from dpr_pipeline.training.groups import read_queries

log = logging.getLogger(__name__)


def rerank_run(model_dir: str | Path, run_path: str | Path, passages_path: str | Path, queries_path: str | Path,
               output_run: str | Path, *, depth: int, max_length: int, batch_size: int, tag: str,
               bf16: bool = False) -> None:
    """Re-score each query's top ``depth`` hits of a TREC run with θ(q, d), sorted by θ, followed by the
    query's remaining hits (:func:`~dpr_pipeline.data.trec_runs.append_tail`).

    Every query of the run must be in the queries artifact and every document in the passage store
    ``passages_path`` (the corpus). Equal θ are ordered by doc id (:func:`~dpr_pipeline.data.trec_runs.rank_order`), as
    every run the pipeline writes.
    """
    store = PassageStore.open(passages_path)
    queries = read_queries(queries_path)
    run = read_trec_run(run_path)
    ranked = run.assign(rank=run.groupby("query_id", sort=False).cumcount())
    top = ranked[ranked["rank"] < depth].reset_index(drop=True)
    unknown_query = next((q for q in top["query_id"].unique() if q not in queries), None)
    if unknown_query is not None:
        raise DataError(run_path, f"query {unknown_query!r} is not in the queries artifact {queries_path}",
                        "re-rank a run of the same dataset and split as the queries artifact")
    rows = store.rows_of(top["doc_id"].tolist())
    if (rows < 0).any():
        raise DataError(run_path, f"document {top['doc_id'].iat[int(np.argmax(rows < 0))]!r} is not in the corpus "
                        f"({passages_path})", "re-rank a run retrieved from the same dataset's corpus")
    model, tokenizer = load_scorer(model_dir)
    log.info("re-ranking %d hits of %d queries (top %d) from %s", len(top), top["query_id"].nunique(), depth,
             run_path)
    scores = score_pairs(model, tokenizer, [queries[q] for q in top["query_id"]],
                         store.passages(rows), max_length=max_length, batch_size=batch_size,
                         description="re-ranking", bf16=bf16)
    reranked = top.assign(score=scores).sort_values(["query_id", "score", "doc_id"], ascending=[True, False, True],
                                                    kind="stable")
    tails = {qid: hits["doc_id"].tolist() for qid, hits in ranked[ranked["rank"] >= depth].groupby("query_id")}
    write_trec_run(((qid, append_tail(list(zip(hits["doc_id"], hits["score"].astype(float))), tails.get(qid, [])))
                    for qid, hits in reranked.groupby("query_id", sort=False)), output_run, tag)

