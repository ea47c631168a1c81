"""Retrieval metrics through ir-measures (pytrec_eval's trec_eval code, and MS MARCO's official MRR).

Names are ir-measures' (``nDCG@10``, ``R@50``, ``R@1000``, ``P(rel=2)@10`` ...). ``MRR@k`` (same as
``RR@k``) is MS MARCO's official MRR@k, computed by ir-measures' ``msmarco`` provider: the reciprocal rank
of the first relevant document within the top k, documents ordered by score, ties broken by doc id.

Every metric is averaged over **all** queries of the qrels that have at least one relevant judgement
(relevance >= 1); a query the run does not answer counts as 0 (as MS MARCO's script and ``trec_eval -c`` do), and
so does a query whose relevant documents are missing from the corpus (ingestion keeps such judgements in an
evaluation split, as trec_eval and BEIR score them). metrics.json's ``counts`` says, per split, how many queries
were scored, how many had no hit, how many judgements name unknown documents and how many judged queries had no
relevant judgement (:func:`evaluation_counts`), and the queries ingestion dropped from the split, per reason
(``queries_dropped_at_ingestion``, from the qrels artifact: ``data.ingest.ingestion_counts``).

Graded qrels (TREC DL: 0-3): ``relevance_level`` is the smallest grade that binary metrics (MRR, recall,
precision, MAP, ...) count as relevant, 2 for TREC DL as its organisers and the SimLM paper use it
(``trec_eval -l 2``); graded metrics (nDCG, ERR) always use the grades themselves. A query without a document of
that grade scores 0 in the binary metrics.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pandas as pd
import pyarrow.parquet as pq

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.answers import label_hits, read_passage_texts
from dpr_pipeline.data.ingest import read_ingestion_counts
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.orchestration.manifests import describe_files


def parse_metric(name: str):
    """The ir-measures measure and the provider that computes it for a metric name.

    Reciprocal rank (``MRR@k``/``RR@k``) goes to the ``msmarco`` provider: pytrec_eval's ``recip_rank``
    ignores the cutoff (it would credit a first relevant document at rank 58 under RR@10).
    """
    import ir_measures  # in the eval env: not in the torch env of the jobs that import the config

    try:
        measure = ir_measures.parse_measure(name[1:] if name.startswith("MRR@") else name)
    except (ValueError, NameError, SyntaxError, TypeError) as err:
        raise ValueError(f"unknown metric {name!r} ({err}); use ir-measures names such as nDCG@10, R@1000, "
                         "or MRR@10 for MS MARCO's official MRR") from None
    provider = "msmarco" if measure.NAME == "RR" else "pytrec_eval"
    return measure, ir_measures.providers.registry[provider]


#: metrics.json's key for where its numbers come from.
PROVENANCE = "provenance"
#: metrics.json's key for what each split's means are taken over (:func:`evaluation_counts`).
COUNTS = "counts"
#: metrics.json's key for each query's value, ``{split: {metric: {query_id: value}}}``: what two stages are
#: compared by, query by query (:mod:`dpr_pipeline.evaluation.paired_difference`).
PER_QUERY = "per_query"
#: metrics.json's keys that are not evaluation splits.
NOT_SPLITS = (PROVENANCE, COUNTS, PER_QUERY)

GRADED_MEASURES = ("nDCG", "ERR")  # use the graded labels; every other measure is binary at relevance_level


def per_query_metrics(run: pd.DataFrame, qrels: pd.DataFrame, metrics: list[str],
                      qrels_source: str = "qrels", relevance_level: int = 1) -> pd.DataFrame:
    """One row per judged query (with a relevant document), one column per metric; unanswered = 0.

    Binary metrics count grades >= ``relevance_level`` as relevant; nDCG and ERR use the grades."""
    if relevance_level < 1:
        raise ValueError(f"relevance_level must be >= 1, got {relevance_level}")
    relevant = qrels.loc[qrels["relevance"] > 0, "query_id"].unique()
    if len(relevant) == 0:
        raise DataError(qrels_source, "no query has a relevant judgement (relevance >= 1)",
                        "check the split's qrels")
    graded = nested(qrels, "relevance")
    binary = nested(qrels.assign(relevance=qrels["relevance"].where(qrels["relevance"] >= relevance_level, 0)),
                    "relevance")
    run_ir = nested(run, "score")
    values: dict[str, dict[str, float]] = defaultdict(dict)
    by_provider = defaultdict(list)
    for name in metrics:
        measure, provider = parse_metric(name)
        by_provider[provider, measure.NAME in GRADED_MEASURES].append((name, measure))
    for (provider, uses_grades), named in by_provider.items():
        qrels_ir = graded if uses_grades else binary
        names = defaultdict(list)  # two names may be one measure (MRR@10 and RR@10)
        for name, measure in named:
            names[measure].append(name)
        for metric in provider.iter_calc(list(names), qrels_ir, run_ir):
            for name in names[metric.measure]:
                values[name][metric.query_id] = float(metric.value)
    table = pd.DataFrame({name: [values[name].get(q, 0.0) for q in relevant] for name in metrics},
                         index=pd.Index(relevant, name="query_id"))
    return table


def nested(frame: pd.DataFrame, value: str) -> dict[str, dict[str, float | int]]:
    """``{query_id: {doc_id: value}}`` of a run's or qrels' rows: ir-measures' own input shape, built from whole
    columns (handing it the frame makes it read the rows one by one: 6× slower on SciFact's 1,000-deep test run)."""
    rows: dict[str, dict] = {}
    for query, doc, entry in zip(frame["query_id"].tolist(), frame["doc_id"].tolist(), frame[value].tolist()):
        rows.setdefault(query, {})[doc] = entry
    return rows


def evaluate_run(run: pd.DataFrame, qrels: pd.DataFrame, metrics: list[str],
                 qrels_source: str = "qrels", relevance_level: int = 1) -> dict[str, float]:
    """Mean of each metric over the judged queries, plus ``num_queries``; errors name ``qrels_source``."""
    return mean_metrics(per_query_metrics(run, qrels, metrics, qrels_source, relevance_level))


def mean_metrics(table: pd.DataFrame) -> dict[str, float]:
    """``num_queries`` and each column's mean of a per-query table (one row per query)."""
    return {"num_queries": int(len(table)), **{name: float(table[name].mean()) for name in table.columns}}


def per_query_values(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """A per-query table as metrics.json's ``per_query`` entry of one split: ``{metric: {query_id: value}}``."""
    return {name: {str(query): float(value) for query, value in table[name].items()} for name in table.columns}


def unknown_document_judgements(qrels_path) -> int | None:
    """How many judgements of a qrels artifact name a document the corpus lacks (kept by ingestion for an
    evaluation split under ``unknown_qrels_ids: warn``); None for an artifact written before it was recorded."""
    metadata = pq.read_schema(qrels_path).metadata or {}
    value = metadata.get(b"dpr_pipeline.unknown_documents")
    return int(value) if value is not None else None


def evaluation_counts(run: pd.DataFrame, qrels: pd.DataFrame, unknown_documents: int | None) -> dict[str, int | None]:
    """What a split's means are taken over, as trec_eval (``-c``) and BEIR count: every judged query with a
    relevant judgement is scored (``queries_scored``, the denominator), including those the run gives no hit
    (``queries_without_hits``, scored 0) and those whose relevant documents are missing from the corpus
    (``judgements_naming_unknown_documents``, such judgements; they can never be retrieved); queries judged
    only with grade 0 cannot be scored (``judged_queries_without_relevant``, left out of the mean)."""
    judged = pd.unique(qrels["query_id"])
    relevant = set(qrels.loc[qrels["relevance"] > 0, "query_id"])
    answered = set(run["query_id"])
    return {"queries_scored": len(relevant),
            "queries_without_hits": sum(1 for q in relevant if q not in answered),
            "judgements_naming_unknown_documents": unknown_documents,
            "judged_queries_without_relevant": int(sum(1 for q in judged if q not in relevant))}


def drop_identical_ids(run: pd.DataFrame) -> pd.DataFrame:
    """The run without hits whose doc id equals the query id (BEIR's ``ignore_identical_ids``: in ArguAna and
    Quora the queries are corpus documents, and retrieving a query itself is not an answer). The remaining hits
    keep their scores, so each query's later hits move up one rank."""
    return run.loc[run["query_id"] != run["doc_id"]].reset_index(drop=True)


def evaluate_splits(runs: list[str], qrels: list[str], splits: list[str], metrics: list[str],
                    output: str, relevance_levels: dict[str, int] | None = None,
                    ignore_identical_ids: bool = False, manifest: str | None = None) -> dict[str, dict[str, float]]:
    """Evaluate one run per split against its qrels artifact; write ``{split: {metric: value}}`` as JSON, plus
    ``provenance``: the stage's ``manifest`` (path) and the SHA-256 of each run and qrels file evaluated.

    ``relevance_levels``: per split, the smallest grade binary metrics count as relevant (default 1).
    ``ignore_identical_ids``: drop hits whose doc id equals the query id first (:func:`drop_identical_ids`)."""
    if not (len(runs) == len(qrels) == len(splits)):
        raise ValueError("runs, qrels and splits must be parallel lists")
    levels = relevance_levels or {}

    def read_run(path):
        run = read_trec_run(path)
        return drop_identical_ids(run) if ignore_identical_ids else run

    result, counts, per_query = {}, {}, {}
    for split, run_path, judged in zip(splits, runs, qrels):
        run, judgements = read_run(run_path), read_artifact(judged, "qrels")
        table = per_query_metrics(run, judgements, metrics, str(judged), int(levels.get(split, 1)))
        result[split], per_query[split] = mean_metrics(table), per_query_values(table)
        counts[split] = evaluation_counts(run, judgements, unknown_document_judgements(judged))
        counts[split]["queries_dropped_at_ingestion"] = (read_ingestion_counts(judged) or {}).get("queries_dropped")
    write_metrics(output, result, manifest, splits, counts=counts, per_query=per_query, runs=runs, qrels=qrels)
    return result


def write_metrics(output: str, result: dict, manifest: str | None, splits: list[str], counts: dict | None = None,
                  per_query: dict | None = None, **evaluated: list[str]) -> None:
    """Write ``{split: {metric: value}}``, ``counts`` (``{split: {...}}``, :func:`evaluation_counts`),
    ``per_query`` (``{split: {metric: {query_id: value}}}``) and ``provenance``: the stage's ``manifest`` (path)
    and, per kind of file evaluated (runs, qrels or answers), each split's file with its SHA-256."""
    provenance = {"manifest": str(manifest) if manifest else None,
                  **{kind: describe_files(dict(zip(splits, paths))) for kind, paths in evaluated.items()}}
    extra = {key: value for key, value in ((COUNTS, counts), (PER_QUERY, per_query)) if value is not None}
    with atomic_output(output) as tmp:
        tmp.write_text(json.dumps({**result, **extra, PROVENANCE: provenance}, indent=2) + "\n")


# ------------------------------------------------------------------------------ answer-based relevance (DPR)
def accuracy_cutoff(name: str) -> int:
    """``k`` of a top-k retrieval accuracy name: ``R@k`` (SimLM Table 4's name for it) or ``Acc@k``."""
    prefix, _, k = name.partition("@")
    if prefix not in ("R", "Acc") or not k.isdigit() or int(k) < 1:
        raise ValueError(f"unknown metric {name!r} for answer-based relevance; use R@k or Acc@k (top-k retrieval "
                         "accuracy, e.g. R@20)")
    return int(k)


def answer_accuracy(run: pd.DataFrame, labels: pd.Series, query_ids, metrics: list[str]) -> dict[str, float]:
    """Top-k retrieval accuracy (DPR; SimLM's NQ R@k): the fraction of ``query_ids`` with at least one
    answer-containing hit (``labels``, per run row) among their first k hits by rank. A question the run does
    not answer counts as 0. Returns ``num_queries`` and one value per metric name."""
    return mean_metrics(per_query_answer_accuracy(run, labels, query_ids, metrics))


def per_query_answer_accuracy(run: pd.DataFrame, labels: pd.Series, query_ids, metrics: list[str]) -> pd.DataFrame:
    """One row per question of ``query_ids``, one column per metric: 1.0 where an answer-containing hit is among
    the question's first k hits (:func:`answer_accuracy`), else 0.0."""
    cutoffs = {name: accuracy_cutoff(name) for name in metrics}
    query_ids = pd.Index(pd.unique(pd.Series(list(query_ids), dtype=object)), name="query_id")
    if len(query_ids) == 0:
        raise ValueError("no questions to evaluate")
    hits = run.assign(has_answer=labels.to_numpy(bool)).sort_values(["query_id", "rank"], kind="stable")
    hits["position"] = hits.groupby("query_id", sort=False).cumcount() + 1
    first = hits[hits["has_answer"]].groupby("query_id")["position"].min()
    first = first.reindex(query_ids)  # NaN: no answer-containing hit (or not in the run)
    return pd.DataFrame({name: (first <= k).astype(float) for name, k in cutoffs.items()}, index=query_ids)


def evaluate_answer_splits(runs: list[str], answers: list[str], corpus: str, splits: list[str], metrics: list[str],
                           output: str, manifest: str | None = None) -> dict[str, dict[str, float]]:
    """Evaluate one run per split by answer containment (:mod:`dpr_pipeline.data.answers`), every question of the
    split's answers artifact counted; write ``{split: {"num_queries": n, metric: value}}`` as JSON."""
    if not (len(runs) == len(answers) == len(splits)):
        raise ValueError("runs, answers and splits must be parallel lists")
    for name in metrics:
        accuracy_cutoff(name)
    result, counts, per_query = {}, {}, {}
    for split, run_path, answers_path in zip(splits, runs, answers):
        run = read_trec_run(run_path)
        if len(run):
            run = run[run["rank"] <= max(accuracy_cutoff(name) for name in metrics)]
        questions = read_artifact(answers_path, "answers")
        labels = label_hits(run, questions, read_passage_texts(corpus, run["doc_id"]))
        table = per_query_answer_accuracy(run, labels, questions["query_id"], metrics)
        result[split], per_query[split] = mean_metrics(table), per_query_values(table)
        answered = set(run["query_id"])
        counts[split] = {"queries_scored": result[split]["num_queries"],
                         "queries_without_hits": int(sum(q not in answered for q in set(questions["query_id"])))}
    write_metrics(output, result, manifest, splits, counts=counts, per_query=per_query, runs=runs, answers=answers)
    return result
