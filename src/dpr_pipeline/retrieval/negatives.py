"""The negatives artifact: per train query its positives and hard negatives, each with a score.

Every fine-tuning stage reads and writes this shape (see docs/artifacts.md): BM25 negatives, mined
negatives, teacher scores. ``negatives_from_run`` builds the candidate pool from a ranked run;
``sample_negatives`` draws the configured number from a pool, reproducibly per query.
"""

from __future__ import annotations

import logging
import zlib

import numpy as np
import pandas as pd

from dpr_pipeline.data.answers import label_hits, read_passage_texts
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.data.trec_runs import read_trec_run

log = logging.getLogger(__name__)


def negatives_from_run(run: pd.DataFrame, qrels: pd.DataFrame, depth: int, min_relevance: int = 1,
                       excluded: pd.Series | None = None) -> pd.DataFrame:
    """Per query with a positive judgement: positives, and the run's top ``depth`` minus the positives.

    ``excluded``: a boolean per row of ``run`` (same index); those hits are never negatives (answer-based
    datasets: the hits that contain an answer, SimLM §B).

    ``run`` has columns query_id, doc_id, rank, score; scores are the run's (NaN for an unretrieved positive).
    Negatives stay in rank order. A judged query absent from the run gets an empty negative list.
    """
    positives = (qrels[qrels["relevance"] >= min_relevance].groupby("query_id", sort=False)["doc_id"]
                 .apply(list))
    if excluded is not None:
        run = run[~excluded.reindex(run.index, fill_value=False).to_numpy()]
    top = run[run["rank"] <= depth].sort_values(["query_id", "rank"], kind="stable")
    by_query = {qid: group for qid, group in top.groupby("query_id", sort=False)}
    rows = []
    for qid, pos in positives.items():
        hits = by_query.get(qid)
        score_of = dict(zip(hits["doc_id"], hits["score"])) if hits is not None else {}
        pos_set = set(pos)
        negs = [] if hits is None else [(d, s) for d, s in zip(hits["doc_id"], hits["score"]) if d not in pos_set]
        rows.append({"query_id": qid, "positive_ids": pos,
                     "positive_scores": [float(score_of.get(d, np.nan)) for d in pos],
                     "negative_ids": [d for d, _ in negs], "negative_scores": [float(s) for _, s in negs]})
    frame = pd.DataFrame(rows, columns=["query_id", "positive_ids", "positive_scores", "negative_ids",
                                        "negative_scores"])
    without = int((frame["negative_ids"].map(len) == 0).sum())
    if without:
        log.warning("%d of %d train queries have no negative in the top %d", without, len(frame), depth)
    return frame


def _query_rng(seed: int, query_id: str) -> np.random.Generator:
    """A generator that depends only on the seed and the query id, not on the order of queries."""
    return np.random.default_rng([seed, zlib.crc32(query_id.encode("utf-8"))])


def sample_negatives(pool: pd.DataFrame, keep: int, seed: int) -> pd.DataFrame:
    """Keep at most ``keep`` negatives per query, drawn uniformly without replacement, in pool order."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    ids, scores = [], []
    for qid, nids, nscores in zip(pool["query_id"], pool["negative_ids"], pool["negative_scores"]):
        nids, nscores = list(nids), list(nscores)
        if len(nids) > keep:
            chosen = np.sort(_query_rng(seed, qid).choice(len(nids), size=keep, replace=False))
            nids, nscores = [nids[i] for i in chosen], [nscores[i] for i in chosen]
        ids.append(nids)
        scores.append(nscores)
    return pool.assign(negative_ids=ids, negative_scores=scores)


def _write_sample(candidates: pd.DataFrame, output: str, *, source: str, depth: int, keep: int,
                  seed: int) -> pd.DataFrame:
    frame = sample_negatives(candidates, keep, seed)
    write_artifact(frame, output, "negatives", metadata={"source": source, "depth": str(depth),
                                                         "keep": str(keep), "seed": str(seed)})
    log.info("%s negatives for %d queries (mean %.1f per query)", source, len(frame),
             frame["negative_ids"].map(len).mean())
    return frame


def answer_hits(run: pd.DataFrame, answers: str, corpus: str) -> pd.Series:
    """Per hit of ``run``, whether its passage contains one of the query's answers (answers artifact)."""
    labels = label_hits(run, read_artifact(answers, "answers"), read_passage_texts(corpus, run["doc_id"]))
    log.info("%d of %d hits contain an answer and are never negatives", int(labels.sum()), len(labels))
    return labels


def mine_hard_negatives(run: str, qrels: str, output: str, *, depth: int, keep: int, seed: int,
                        min_relevance: int = 1, source: str, answers: str | None = None,
                        corpus: str | None = None) -> pd.DataFrame:
    """Hard negatives from a retriever's TREC run on the train queries: its top ``depth`` minus the
    positives, ``keep`` sampled per query (seeded), written as the negatives artifact with the run's scores.

    With ``answers`` (and ``corpus``), an answer-based dataset: hits containing an answer are left out too."""
    hits = read_trec_run(run)
    top = hits[hits["rank"] <= depth]
    excluded = answer_hits(top, answers, corpus) if answers is not None else None
    candidates = negatives_from_run(top, read_artifact(qrels, "qrels"), depth, min_relevance, excluded)
    return _write_sample(candidates, output, source=source, depth=depth, keep=keep, seed=seed)


def write_bm25_negatives(pool: str, qrels: str, output: str, *, depth: int, keep: int, seed: int,
                         min_relevance: int = 1, answers: str | None = None,
                         corpus: str | None = None) -> pd.DataFrame:
    """The BM25 negatives artifact from a TREC run (``.trec``) or official negatives (negatives artifact).

    From a run: the top ``depth`` minus the positives; from official negatives: their list. Either way
    ``keep`` are sampled per query (seeded) and written with their scores.
    """
    if str(pool).endswith(".trec"):
        return mine_hard_negatives(pool, qrels, output, depth=depth, keep=keep, seed=seed,
                                   min_relevance=min_relevance, source="bm25", answers=answers, corpus=corpus)
    return _write_sample(read_artifact(pool, "negatives"), output, source="official", depth=depth, keep=keep,
                         seed=seed)
