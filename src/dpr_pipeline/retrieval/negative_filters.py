"""Positive-aware filters on a query's candidate negatives (config ``mining.<stage>``: ``relative_margin``,
``absolute_margin``, ``max_score``, ``range_min``; every one off by default).

A candidate is dropped when it scores too close to the query's positive (the margins, as sentence-transformers'
``mine_hard_negatives`` defines them; NV-Retriever's TopK-PercPos, arXiv 2407.15831, is the relative margin), above
a fixed score (``max_score``, sentence-transformers), or among the run's first ranks (``range_min``, FlagEmbedding's
``range_for_sampling``). Dropped candidates are likely unjudged relevant passages (false negatives).

The reference score of the margins is the query's best-scoring *retrieved* positive. When none of its positives was
retrieved (every positive score NaN) the margins cannot apply: the query keeps those candidates (``max_score`` and
``range_min`` still apply) and is counted in ``queries_without_positive_score``. A NaN candidate score (official
negatives carry none) is never dropped by a score filter.

Thresholds are inclusive: a candidate scoring exactly at a threshold is kept (sentence-transformers drops only
``score > threshold``), and ``range_min: k`` drops ranks 1..k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from dpr_pipeline.errors import ConfigError

#: The filters in the order a dropped candidate is attributed to them (the first that drops it counts it).
FILTER_KEYS = ("range_min", "max_score", "absolute_margin", "relative_margin")


@dataclass(frozen=True)
class NegativeFilters:
    """The filters of one mined stage; None = off. ``setting``: the config block they come from (its errors name
    it)."""

    range_min: int | None = None
    max_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    setting: str = "mining.<stage>"

    def __post_init__(self) -> None:
        def bad(key: str, value, fix: str) -> ConfigError:
            return ConfigError(f"config key {self.setting}.{key} = {value!r}: {fix}")

        def number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        r, a, k, m = self.relative_margin, self.absolute_margin, self.range_min, self.max_score
        if r is not None and not (number(r) and 0 <= r < 1):
            raise bad("relative_margin", r, "a fraction of the positive's score in [0, 1). "
                      "Fix: set it in [0, 1) (NV-Retriever: 0.05), or null to turn it off")
        if a is not None and not (number(a) and a >= 0):
            raise bad("absolute_margin", a,
                      "a score difference in the run's units. Fix: set it >= 0, or null to turn it off")
        if m is not None and not number(m):
            raise bad("max_score", m, "a score in the run's units. Fix: set a finite number, or null to turn it off")
        if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise bad("range_min", k,
                      "the number of top ranks to skip. Fix: set an integer >= 0, or null to turn it off")

    @classmethod
    def from_settings(cls, settings: dict, setting: str = "mining.<stage>") -> NegativeFilters:
        """The filters among a job's mining settings (keys absent or null: off)."""
        return cls(**{key: settings.get(key) for key in FILTER_KEYS}, setting=setting)

    def active(self) -> dict:
        """``{key: value}`` of the filters that are on."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in FILTER_KEYS and getattr(self, f.name) is not None}


def reference_score(positive_scores: Iterable[float]) -> float:
    """The margins' reference: the best score among the query's retrieved positives (NaN scores are unretrieved
    ones); NaN when none was retrieved."""
    scores = [float(s) for s in positive_scores if s is not None and not math.isnan(float(s))]
    return max(scores) if scores else math.nan


def relative_threshold(positive: float, margin: float) -> float:
    """The highest score a negative may have under ``relative_margin``: ``positive − |positive| × margin``
    (sentence-transformers' form; = positive × (1 − margin) for a positive score ≥ 0, and still below the positive
    when it is negative)."""
    return positive - abs(positive) * margin


def drop_reason(score: float, rank: int, positive: float, filters: NegativeFilters) -> str | None:
    """Which filter drops a candidate of ``score`` at ``rank`` (1-based, the run's rank) for a query whose
    reference positive scores ``positive`` (NaN: none retrieved), in :data:`FILTER_KEYS` order; None: kept."""
    if filters.range_min is not None and rank <= filters.range_min:
        return "range_min"
    if math.isnan(score):
        return None
    if filters.max_score is not None and score > filters.max_score:
        return "max_score"
    if math.isnan(positive):
        return None
    if filters.absolute_margin is not None and score > positive - filters.absolute_margin:
        return "absolute_margin"
    if filters.relative_margin is not None and score > relative_threshold(positive, filters.relative_margin):
        return "relative_margin"
    return None


def drop_codes(scores: np.ndarray, ranks: np.ndarray, positive: float, filters: NegativeFilters) -> np.ndarray:
    """:func:`drop_reason` for a query's candidates at once: per candidate 0 (kept) or 1 + the index in
    :data:`FILTER_KEYS` of the first filter that drops it."""
    codes = np.zeros(len(scores), dtype=np.int8)
    with np.errstate(invalid="ignore"):                     # NaN compares False: an unscored candidate stays
        masks = [ranks <= filters.range_min if filters.range_min is not None else None,
                 scores > filters.max_score if filters.max_score is not None else None]
        if not math.isnan(positive):
            masks += [scores > positive - filters.absolute_margin if filters.absolute_margin is not None else None,
                      scores > relative_threshold(positive, filters.relative_margin)
                      if filters.relative_margin is not None else None]
    for code, mask in enumerate(masks, start=1):
        if mask is not None:
            codes[(codes == 0) & mask] = code
    return codes


def filter_query(negative_ids: Sequence[str], negative_scores: Sequence[float], ranks: Sequence[int],
                 positive: float, filters: NegativeFilters) -> tuple[list[int], list[tuple[int, str]]]:
    """One query's candidates split into the indices kept and ``(index, reason)`` of those dropped, both in the
    candidates' order."""
    codes = drop_codes(np.asarray(negative_scores, dtype=np.float64), np.asarray(ranks, dtype=np.int64), positive,
                       filters)
    return ([int(i) for i in np.flatnonzero(codes == 0)],
            [(int(i), FILTER_KEYS[codes[i] - 1]) for i in np.flatnonzero(codes)])


def threshold(reason: str, positive: float, filters: NegativeFilters) -> float:
    """The limit a candidate dropped by ``reason`` went past: the last rank skipped (range_min), else the highest
    score kept."""
    if reason == "range_min":
        return float(filters.range_min)
    if reason == "max_score":
        return float(filters.max_score)
    if reason == "absolute_margin":
        return positive - filters.absolute_margin
    return relative_threshold(positive, filters.relative_margin)


DROPPED_COLUMNS = ["query_id", "doc_id", "rank", "score", "positive_score", "reason", "threshold"]


def filter_pool(pool: pd.DataFrame, filters: NegativeFilters, keep: int,
                ranks: Sequence[Sequence[int]] | None = None, sample_size: int | None = None,
                seed: int = 0) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """Apply ``filters`` to a candidate pool (negatives schema): the pool without the dropped candidates, the
    counts, and the dropped pairs (:data:`DROPPED_COLUMNS`; with ``sample_size``, only
    :func:`sample_dropped`'s draw of them, ``seed``, so that a large collection never holds them all).

    ``ranks``: per row, each candidate's rank in the run it came from (positives counted); None: its position in
    the list (1-based: official negatives). ``keep``: the negatives a query is asked for, to count the queries
    left with fewer (before and after the filters).

    The counts: ``candidates``, ``kept``, ``dropped`` (per filter of :data:`FILTER_KEYS`, each candidate counted
    by the first that drops it; 0 for a filter that is off), ``dropped_total``, ``queries``,
    ``queries_without_positive_score`` (no positive retrieved: the margins did not apply to them),
    ``queries_with_drops``, ``queries_fewer_than_keep_before`` and ``queries_fewer_than_keep`` (after),
    ``queries_without_negatives_before`` and ``queries_without_negatives`` (after).
    """
    before = pool["negative_ids"].map(len).to_numpy()
    references = np.array([reference_score(p) for p in pool["positive_scores"]], dtype=np.float64)
    counts = {"filters": filters.active(), "keep": keep, "candidates": int(before.sum()), "kept": 0,
              "dropped": {key: 0 for key in FILTER_KEYS}, "dropped_total": 0, "queries": len(pool),
              "queries_without_positive_score": int(np.isnan(references).sum()), "queries_with_drops": 0,
              "queries_fewer_than_keep_before": int((before < keep).sum()), "queries_fewer_than_keep": 0,
              "queries_without_negatives_before": int((before == 0).sum()), "queries_without_negatives": 0}
    if ranks is None:
        ranks = [range(1, n + 1) for n in before]
    kept_ids, kept_scores, dropped_at = [], [], []       # dropped_at: (row, candidate indices, their codes)
    if not counts["filters"]:
        kept_ids, kept_scores = list(pool["negative_ids"]), list(pool["negative_scores"])
    else:
        for row, (ids, scores, query_ranks) in enumerate(zip(pool["negative_ids"], pool["negative_scores"], ranks)):
            codes = drop_codes(np.asarray(scores, dtype=np.float64), np.asarray(query_ranks, dtype=np.int64),
                               references[row], filters)
            kept = np.flatnonzero(codes == 0)
            kept_ids.append([ids[i] for i in kept])
            kept_scores.append([float(scores[i]) for i in kept])
            if len(kept) < len(codes):
                where = np.flatnonzero(codes)
                dropped_at.append((row, where, codes[where]))
    after = np.fromiter((len(ids) for ids in kept_ids), dtype=np.int64, count=len(kept_ids))
    counts["kept"] = int(after.sum())
    counts["dropped_total"] = counts["candidates"] - counts["kept"]
    counts["queries_with_drops"] = len(dropped_at)
    counts["queries_fewer_than_keep"] = int((after < keep).sum())
    counts["queries_without_negatives"] = int((after == 0).sum())
    for _, _, codes in dropped_at:
        for code, n in zip(*np.unique(codes, return_counts=True)):
            counts["dropped"][FILTER_KEYS[code - 1]] += int(n)
    chosen = None
    if sample_size is not None and counts["dropped_total"] > sample_size:
        chosen = set(_draw(counts["dropped_total"], sample_size, seed).tolist())
    rows, position = [], 0
    query_ids, negative_ids, negative_scores = pool["query_id"], pool["negative_ids"], pool["negative_scores"]
    for row, where, codes in dropped_at:
        for i, code in zip(where, codes):
            if chosen is None or position in chosen:
                reason, positive, score = FILTER_KEYS[code - 1], references[row], float(negative_scores.iat[row][i])
                rows.append((query_ids.iat[row], negative_ids.iat[row][i], int(ranks[row][i]), score, positive,
                             reason, threshold(reason, positive, filters)))
            position += 1
    dropped = pd.DataFrame(rows, columns=DROPPED_COLUMNS)
    if sample_size is not None:
        dropped = dropped.sort_values(["query_id", "rank"], kind="stable").reset_index(drop=True)
    return pool.assign(negative_ids=kept_ids, negative_scores=kept_scores), counts, dropped


def _draw(total: int, size: int, seed: int) -> np.ndarray:
    """Which ``size`` of ``total`` dropped pairs (in pool order) the sample shows."""
    return np.sort(np.random.default_rng(seed).choice(total, size=size, replace=False))


def sample_dropped(dropped: pd.DataFrame, size: int, seed: int) -> pd.DataFrame:
    """Up to ``size`` dropped pairs drawn uniformly (seeded), in query and rank order."""
    if len(dropped) > size:
        dropped = dropped.iloc[_draw(len(dropped), size, seed)]
    return dropped.sort_values(["query_id", "rank"], kind="stable").reset_index(drop=True)
