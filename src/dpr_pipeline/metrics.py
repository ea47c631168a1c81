"""Retrieval metrics through ir-measures (pytrec_eval's trec_eval code, and MS MARCO's official MRR).

Names are ir-measures' (``nDCG@10``, ``R@50``, ``R@1000``, ``P(rel=2)@10`` ...). ``MRR@k`` (same as
``RR@k``) is MS MARCO's official MRR@k, computed by ir-measures' ``msmarco`` provider: the reciprocal rank
of the first relevant document within the top k, documents ordered by score, ties broken by doc id.

Every metric is averaged over **all** queries of the qrels that have at least one relevant judgement
(relevance >= 1); a query the run does not answer counts as 0 (as MS MARCO's script and ``trec_eval -c`` do).

Graded qrels (TREC DL: 0-3): ``relevance_level`` is the smallest grade that binary metrics (MRR, recall,
precision, MAP, ...) count as relevant, 2 for TREC DL as its organisers and the SimLM paper use it
(``trec_eval -l 2``); graded metrics (nDCG, ERR) always use the grades themselves. A query without a document of
that grade scores 0 in the binary metrics.
"""

from __future__ import annotations

import json
from collections import defaultdict

import ir_measures
import pandas as pd

from .data.schemas import read_artifact
from .errors import DataError
from .io import atomic_output
from .runs import read_trec_run


def parse_metric(name: str):
    """The ir-measures measure and the provider that computes it for a metric name.

    Reciprocal rank (``MRR@k``/``RR@k``) goes to the ``msmarco`` provider: pytrec_eval's ``recip_rank``
    ignores the cutoff (it would credit a first relevant document at rank 58 under RR@10).
    """
    try:
        measure = ir_measures.parse_measure(name[1:] if name.startswith("MRR@") else name)
    except (ValueError, NameError, SyntaxError, TypeError) as err:
        raise ValueError(f"unknown metric {name!r} ({err}); use ir-measures names such as nDCG@10, R@1000, "
                         "or MRR@10 for MS MARCO's official MRR") from None
    provider = "msmarco" if measure.NAME == "RR" else "pytrec_eval"
    return measure, ir_measures.providers.registry[provider]


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
    graded = qrels[["query_id", "doc_id", "relevance"]]
    binary = graded.assign(relevance=graded["relevance"].where(graded["relevance"] >= relevance_level, 0))
    run_ir = run[["query_id", "doc_id", "score"]]
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


def evaluate_run(run: pd.DataFrame, qrels: pd.DataFrame, metrics: list[str],
                 qrels_source: str = "qrels", relevance_level: int = 1) -> dict[str, float]:
    """Mean of each metric over the judged queries, plus ``num_queries``; errors name ``qrels_source``."""
    table = per_query_metrics(run, qrels, metrics, qrels_source, relevance_level)
    return {"num_queries": int(len(table)), **{name: float(table[name].mean()) for name in metrics}}


def evaluate_splits(runs: list[str], qrels: list[str], splits: list[str], metrics: list[str],
                    output: str, relevance_levels: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Evaluate one run per split against its qrels artifact; write ``{split: {metric: value}}`` as JSON.

    ``relevance_levels``: per split, the smallest grade binary metrics count as relevant (default 1)."""
    if not (len(runs) == len(qrels) == len(splits)):
        raise ValueError("runs, qrels and splits must be parallel lists")
    levels = relevance_levels or {}
    result = {split: evaluate_run(read_trec_run(run), read_artifact(judged, "qrels"), metrics, str(judged),
                                  int(levels.get(split, 1)))
              for split, run, judged in zip(splits, runs, qrels)}
    with atomic_output(output) as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    return result
