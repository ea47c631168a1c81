"""The negatives artifact: per train query its positives and hard negatives, each with a score.

Every fine-tuning stage reads and writes this shape (see docs/artifacts.md): BM25 negatives, mined
negatives, teacher scores. ``negatives_from_run`` builds the candidate pool from a ranked run (``candidate_pool``:
a mining job's pool from its inputs, also read by the denoising scores' job); the filters of
:mod:`dpr_pipeline.retrieval.negative_filters` drop likely false negatives from it; ``sample_negatives`` draws the
configured number from a pool, reproducibly per query.
"""

from __future__ import annotations

import json
import logging
import math
import zlib

import numpy as np
import pandas as pd

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.data.answers import label_hits, read_passage_texts
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.retrieval.negative_filters import NegativeFilters, filter_pool, reference_score

log = logging.getLogger(__name__)


def negatives_from_run(run: pd.DataFrame, qrels: pd.DataFrame, depth: int, min_relevance: int = 1,
                       excluded: pd.Series | None = None, ranks: bool = False) -> pd.DataFrame:
    """Per query with a positive judgement: positives, and the run's top ``depth`` minus the positives.

    ``excluded``: a boolean per row of ``run`` (same index); those hits are never negatives (answer-based
    datasets: the hits that contain an answer, SimLM §B).

    ``run`` has columns query_id, doc_id, rank, score; scores are the run's (NaN for an unretrieved positive).
    Negatives stay in rank order. A judged query absent from the run gets an empty negative list. ``ranks``: a
    column ``negative_ranks`` too, each negative's rank in the run (for the filters' ``range_min``; not part of
    the negatives artifact).
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
        negs = [] if hits is None else [(d, s, r) for d, s, r in zip(hits["doc_id"], hits["score"], hits["rank"])
                                        if d not in pos_set]
        rows.append({"query_id": qid, "positive_ids": pos,
                     "positive_scores": [float(score_of.get(d, np.nan)) for d in pos],
                     "negative_ids": [d for d, _, _ in negs], "negative_scores": [float(s) for _, s, _ in negs],
                     "negative_ranks": [int(r) for _, _, r in negs]})
    columns = ["query_id", "positive_ids", "positive_scores", "negative_ids", "negative_scores"]
    frame = pd.DataFrame(rows, columns=columns + ["negative_ranks"])
    frame = frame if ranks else frame[columns]
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


def denoise_inputs(candidates: pd.DataFrame, scores_path: str) -> tuple[list[np.ndarray], np.ndarray]:
    """The cross-encoder's scores of a candidate pool (``mining.<stage>.denoise``), read from the denoising
    scores' artifact ``scores_path`` (negatives schema, :mod:`dpr_pipeline.reranking.pool_scores`): per row of
    ``candidates``, the score of each candidate in its order, and the best score among the query's positives.

    Pairs are matched by query and passage id; a pool query or candidate the artifact lacks is a DataError (the
    scores are of another pool: the run, qrels or depth changed since)."""
    scored = read_artifact(scores_path, "negatives")
    by_query = {qid: (positive_scores, dict(zip(ids, scores))) for qid, positive_scores, ids, scores in
                zip(scored["query_id"], scored["positive_scores"], scored["negative_ids"], scored["negative_scores"])}
    per_row, references = [], np.full(len(candidates), np.nan)
    fix = "delete it and rerun its denoise_scores job, which scores the pool this mining job reads"
    for row, (qid, ids) in enumerate(zip(candidates["query_id"], candidates["negative_ids"])):
        if qid not in by_query:
            raise DataError(scores_path, f"train query {qid!r} of the mined pool has no cross-encoder scores", fix)
        positive_scores, of = by_query[qid]
        missing = next((d for d in ids if d not in of), None)
        if missing is not None:
            raise DataError(scores_path, f"candidate {missing!r} of train query {qid!r} has no cross-encoder score",
                            fix)
        per_row.append(np.array([of[d] for d in ids], dtype=np.float64))
        references[row] = reference_score(positive_scores)
    return per_row, references


def _write_sample(candidates: pd.DataFrame, output: str, *, source: str, depth: int, keep: int, seed: int,
                  filters: NegativeFilters | None = None, ranks=None, queries: str | None = None,
                  corpus: str | None = None, filter_report: str | None = None,
                  dropped_sample: str | None = None, denoise_scores: str | None = None) -> pd.DataFrame:
    """Filter the pool (``filters``, :mod:`negative_filters`; ``denoise_scores``: the cross-encoder's scores of
    it, when ``filters.denoise`` is on), sample ``keep`` per query and write the negatives artifact; with
    ``filter_report`` and ``dropped_sample``, the filters' counts (JSON) and a sample of the pairs they dropped
    (JSON lines with the query's and the passage's text, read from ``queries`` and ``corpus``)."""
    filters = filters or NegativeFilters()
    if filters.denoise is not None and denoise_scores is None:
        raise ValueError(f"{filters.setting}.denoise is on but no cross-encoder scores of the pool were given")
    ce_scores, ce_references = None, None
    if filters.denoise is not None:
        logits, best = denoise_inputs(candidates, denoise_scores)
        ce_scores, ce_references = [filters.denoise.read(row) for row in logits], filters.denoise.read(best)
    candidates, counts, sample = filter_pool(candidates, filters, keep, ranks, DROPPED_SAMPLE_SIZE, seed,
                                             ce_scores, ce_references)
    log_filter_counts(counts, source)
    frame = sample_negatives(candidates, keep, seed)
    metadata = {"source": source, "depth": str(depth), "keep": str(keep), "seed": str(seed)}
    if counts["filters"]:
        metadata.update(filters=json.dumps(counts["filters"]), dropped=str(counts["dropped_total"]))
    write_artifact(frame, output, "negatives", metadata=metadata)
    log.info("%s negatives for %d queries (mean %.1f per query)", source, len(frame),
             frame["negative_ids"].map(len).mean())
    if filter_report is not None:
        write_filter_report(counts, sample, filter_report, dropped_sample, queries=queries, corpus=corpus)
    return frame


#: Dropped pairs written to a mining job's ``dropped_negatives_sample.jsonl``.
DROPPED_SAMPLE_SIZE = 50


def log_filter_counts(counts: dict, source: str) -> None:
    """The filters' counts in the job's log (one line; a warning when a query is left with no negative)."""
    if not counts["filters"]:
        log.info("%s negatives: no filter on (mining.<stage> relative_margin, absolute_margin, max_score, "
                 "range_min, denoise), 0 of %d candidates dropped", source, counts["candidates"])
        return
    per_filter = ", ".join(f"{key} {n}" for key, n in counts["dropped"].items() if key in counts["filters"])
    log.info("%s negatives: filters %s dropped %d of %d candidates (%s) in %d of %d queries; %d queries had no "
             "positive retrieved (the margins did not apply); %d queries have fewer than keep=%d negatives "
             "(%d before the filters)", source,
             ", ".join(f"{k}={v}" for k, v in counts["filters"].items()), counts["dropped_total"],
             counts["candidates"], per_filter, counts["queries_with_drops"], counts["queries"],
             counts["queries_without_positive_score"], counts["queries_fewer_than_keep"], counts["keep"],
             counts["queries_fewer_than_keep_before"])
    emptied = counts["queries_without_negatives"] - counts["queries_without_negatives_before"]
    if emptied:
        log.warning("%s negatives: the filters left %d queries with no negative (they train on in-batch negatives "
                    "alone): loosen them if that is many", source, emptied)


def write_filter_report(counts: dict, sample: pd.DataFrame, report: str, sample_path: str, *,
                        queries: str | None, corpus: str | None) -> None:
    """The counts as JSON at ``report`` and ``sample`` (dropped pairs) as JSON lines at ``sample_path``, each with
    the query's and the passage's text (empty file when nothing was dropped)."""
    query_text, passage_text = {}, {}
    if len(sample):
        if queries is not None:
            frame = read_artifact(queries, "queries")
            query_text = dict(zip(frame["query_id"], frame["text"]))
        if corpus is not None:
            passage_text = read_passage_texts(corpus, sample["doc_id"])
    denoised = "denoise" in counts["filters"]
    with atomic_outputs(report, sample_path) as (report_tmp, sample_tmp):
        report_tmp.write_text(json.dumps({**counts, "sample_size": len(sample)}, indent=2) + "\n", encoding="utf-8")
        with open(sample_tmp, "w", encoding="utf-8") as out:
            for row in sample.itertuples(index=False):
                pair = {"query_id": row.query_id, "query": query_text.get(row.query_id), "doc_id": row.doc_id,
                        "passage": passage_text.get(row.doc_id), "rank": row.rank, "score": _number(row.score),
                        "positive_score": _number(row.positive_score), "reason": row.reason,
                        "threshold": _number(row.threshold)}
                if denoised:   # the cross-encoder's scores of the pair and of the query's best positive
                    pair.update(denoise_score=_number(row.denoise_score),
                                denoise_positive_score=_number(row.denoise_positive_score))
                out.write(json.dumps(pair, ensure_ascii=False) + "\n")


def _number(value: float) -> float | None:
    """A JSON number, or null for NaN."""
    return None if math.isnan(value) else round(float(value), 6)


def answer_hits(run: pd.DataFrame, answers: str, corpus: str) -> pd.Series:
    """Per hit of ``run``, whether its passage contains one of the query's answers (answers artifact)."""
    labels = label_hits(run, read_artifact(answers, "answers"), read_passage_texts(corpus, run["doc_id"]))
    log.info("%d of %d hits contain an answer and are never negatives", int(labels.sum()), len(labels))
    return labels


def candidate_pool(pool: str, qrels: str, *, depth: int, min_relevance: int = 1, answers: str | None = None,
                   corpus: str | None = None) -> tuple[pd.DataFrame, pd.Series | None]:
    """A mining job's candidate pool, before the filters, and each candidate's rank (None: positions in a list).

    ``pool``: a TREC run (``.trec``: its top ``depth`` minus the positives, :func:`negatives_from_run`; with
    ``answers`` and ``corpus``, an answer-based dataset, hits containing an answer are left out too) or official
    negatives (a negatives artifact, taken as they are)."""
    if not str(pool).endswith(".trec"):
        return read_artifact(pool, "negatives"), None
    hits = read_trec_run(pool)
    top = hits[hits["rank"] <= depth]
    excluded = answer_hits(top, answers, corpus) if answers is not None else None
    candidates = negatives_from_run(top, read_artifact(qrels, "qrels"), depth, min_relevance, excluded, ranks=True)
    return candidates, candidates.pop("negative_ranks")


def write_denoise_pool(pool: str, qrels: str, output: str, *, depth: int, min_relevance: int = 1,
                       answers: str | None = None, corpus: str | None = None) -> int:
    """Write a mined stage's candidate pool (``pool``: a TREC run or official negatives, :func:`candidate_pool`) as
    a negatives artifact, once for all its denoising scores' jobs (:mod:`dpr_pipeline.reranking.pool_scores`: each
    reads the row groups holding its slice); the number of its queries."""
    candidates, _ = candidate_pool(pool, qrels, depth=depth, min_relevance=min_relevance, answers=answers,
                                   corpus=corpus)
    write_artifact(candidates, output, "negatives", metadata={"source": str(pool), "depth": str(depth)})
    log.info("denoising pool of %s: %d train queries, %d candidates", pool, len(candidates),
             int(candidates["negative_ids"].map(len).sum()))
    return len(candidates)


def mine_hard_negatives(run: str, qrels: str, output: str, *, depth: int, keep: int, seed: int,
                        min_relevance: int = 1, source: str, answers: str | None = None,
                        corpus: str | None = None, filters: NegativeFilters | None = None,
                        queries: str | None = None, filter_report: str | None = None,
                        dropped_sample: str | None = None, denoise_scores: str | None = None) -> pd.DataFrame:
    """Hard negatives from a retriever's TREC run on the train queries: its top ``depth`` minus the
    positives, less those ``filters`` drop, ``keep`` sampled per query (seeded), written as the negatives artifact
    with the run's scores (and the filters' report: :func:`_write_sample`; ``denoise_scores``: the
    cross-encoder's scores of the pool, for ``filters.denoise``).

    With ``answers`` (and ``corpus``), an answer-based dataset: hits containing an answer are left out too."""
    candidates, ranks = candidate_pool(run, qrels, depth=depth, min_relevance=min_relevance, answers=answers,
                                       corpus=corpus)
    return _write_sample(candidates, output, source=source, depth=depth, keep=keep, seed=seed, filters=filters,
                         ranks=ranks, queries=queries, corpus=corpus, filter_report=filter_report,
                         dropped_sample=dropped_sample, denoise_scores=denoise_scores)


def write_bm25_negatives(pool: str, qrels: str, output: str, *, depth: int, keep: int, seed: int,
                         min_relevance: int = 1, answers: str | None = None, corpus: str | None = None,
                         filters: NegativeFilters | None = None, queries: str | None = None,
                         filter_report: str | None = None, dropped_sample: str | None = None,
                         denoise_scores: str | None = None) -> pd.DataFrame:
    """The BM25 negatives artifact from a TREC run (``.trec``) or official negatives (negatives artifact).

    From a run: the top ``depth`` minus the positives; from official negatives: their list (``range_min``
    counts positions in it; they carry no scores, so the score filters drop none of them, while ``denoise``, which
    scores them with its cross-encoder, does). Either way ``filters`` apply, then ``keep`` are sampled per query
    (seeded) and written with their scores.

    ``answers`` excludes answer-bearing hits of a run (the official negatives are left as they are); ``corpus``
    gives them, and the dropped sample, the passages' text.
    """
    if str(pool).endswith(".trec"):
        return mine_hard_negatives(pool, qrels, output, depth=depth, keep=keep, seed=seed,
                                   min_relevance=min_relevance, source="bm25", answers=answers, corpus=corpus,
                                   filters=filters, queries=queries, filter_report=filter_report,
                                   dropped_sample=dropped_sample, denoise_scores=denoise_scores)
    return _write_sample(read_artifact(pool, "negatives"), output, source="official", depth=depth, keep=keep,
                         seed=seed, filters=filters, queries=queries, corpus=corpus, filter_report=filter_report,
                         dropped_sample=dropped_sample, denoise_scores=denoise_scores)
