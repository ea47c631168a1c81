"""Positive-aware filters on a query's candidate negatives (config ``mining.<stage>``: ``relative_margin``,
``absolute_margin``, ``max_score``, ``range_min``, ``denoise``; every one off by default).

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

``denoise`` (:class:`Denoise`) applies the same margins and ``max_score`` to a cross-encoder's scores of the pool
instead of the run's (RocketQA's denoising; sentence-transformers' ``mine_hard_negatives(cross_encoder=...)``
rescoring): its reference is the cross-encoder's best score among *all* the query's positives (it scores each one,
retrieved or not). The scores come from :mod:`dpr_pipeline.reranking.pool_scores` (a GPU job); the filter itself is
plain arithmetic here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from dpr_pipeline.errors import ConfigError

#: The filters in the order a dropped candidate is attributed to them (the first that drops it counts it).
FILTER_KEYS = ("range_min", "max_score", "absolute_margin", "relative_margin", "denoise")
#: The thresholds of ``denoise`` (on the cross-encoder's scores), named as the run-score filters.
DENOISE_THRESHOLDS = ("relative_margin", "absolute_margin", "max_score")
#: ``denoise``'s keys that are the scoring job's (rule denoise_scores), not the filter's.
DENOISE_SCORING = ("model", "max_length", "batch_size", "bf16")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_thresholds(setting: str, relative_margin, absolute_margin, max_score, units: str) -> None:
    """The margins' and ``max_score``'s bounds, one ConfigError naming ``setting.<key>`` and the fix."""
    def bad(key: str, value, fix: str) -> ConfigError:
        return ConfigError(f"config key {setting}.{key} = {value!r}: {fix}")

    r, a, m = relative_margin, absolute_margin, max_score
    if r is not None and not (_number(r) and 0 <= r < 1):
        raise bad("relative_margin", r, "a fraction of the positive's score in [0, 1). "
                  "Fix: set it in [0, 1) (NV-Retriever: 0.05), or null to turn it off")
    if a is not None and not (_number(a) and a >= 0):
        raise bad("absolute_margin", a, f"a score difference in {units}. Fix: set it >= 0, or null to turn it off")
    if m is not None and not _number(m):
        raise bad("max_score", m, f"a score in {units}. Fix: set a finite number, or null to turn it off")


@dataclass(frozen=True)
class Denoise:
    """``mining.<stage>.denoise``: the margins and ``max_score`` on a cross-encoder's scores of the pool (at least
    one on). ``sigmoid``: the scores are σ(θ), a probability for a cross-encoder trained with binary cross-entropy,
    else the logit θ. ``model`` is recorded in the counts (the scoring job loads it)."""

    model: str
    relative_margin: float | None = None
    absolute_margin: float | None = None
    max_score: float | None = None
    sigmoid: bool = False
    setting: str = "mining.<stage>.denoise"

    def __post_init__(self) -> None:
        _check_thresholds(self.setting, self.relative_margin, self.absolute_margin, self.max_score,
                          "the cross-encoder's units")
        if all(getattr(self, key) is None for key in DENOISE_THRESHOLDS):
            raise ConfigError(f"config key {self.setting}: names a cross-encoder but no threshold, so it would "
                              f"drop nothing. Fix: set one of {', '.join(DENOISE_THRESHOLDS)} under it, or set "
                              f"{self.setting} to null")

    @classmethod
    def from_settings(cls, settings: dict | None, setting: str = "mining.<stage>.denoise") -> Denoise | None:
        """The denoising of a job's ``mining.<stage>.denoise`` block (None or absent: off)."""
        if not settings:
            return None
        return cls(model=str(settings["model"]), sigmoid=bool(settings.get("sigmoid", False)), setting=setting,
                   **{key: settings.get(key) for key in DENOISE_THRESHOLDS})

    def active(self) -> dict:
        """The model, the score it is read as and the thresholds that are on."""
        return {"model": self.model, "scores": "sigmoid" if self.sigmoid else "logit",
                **{key: getattr(self, key) for key in DENOISE_THRESHOLDS if getattr(self, key) is not None}}

    def read(self, logits: np.ndarray) -> np.ndarray:
        """The scores the thresholds apply to, from the cross-encoder's logits θ: σ(θ) with ``sigmoid``, else θ."""
        logits = np.asarray(logits, dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-logits)) if self.sigmoid else logits

    def threshold(self, positive: float) -> float:
        """The highest cross-encoder score kept for a query whose best positive scores ``positive`` (NaN: no
        reference, only ``max_score`` applies; inf: no threshold applies)."""
        limits = [] if self.max_score is None else [float(self.max_score)]
        if not math.isnan(positive):
            if self.absolute_margin is not None:
                limits.append(positive - self.absolute_margin)
            if self.relative_margin is not None:
                limits.append(relative_threshold(positive, self.relative_margin))
        return min(limits, default=math.inf)


@dataclass(frozen=True)
class NegativeFilters:
    """The filters of one mined stage; None = off. ``setting``: the config block they come from (its errors name
    it)."""

    range_min: int | None = None
    max_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    denoise: Denoise | None = None
    setting: str = "mining.<stage>"

    def __post_init__(self) -> None:
        _check_thresholds(self.setting, self.relative_margin, self.absolute_margin, self.max_score, "the run's units")
        k = self.range_min
        if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise ConfigError(f"config key {self.setting}.range_min = {k!r}: the number of top ranks to skip. Fix: "
                              "set an integer >= 0, or null to turn it off")

    @classmethod
    def from_settings(cls, settings: dict, setting: str = "mining.<stage>") -> NegativeFilters:
        """The filters among a job's mining settings (keys absent or null: off)."""
        return cls(**{key: settings.get(key) for key in FILTER_KEYS if key != "denoise"},
                   denoise=Denoise.from_settings(settings.get("denoise"), f"{setting}.denoise"), setting=setting)

    def active(self) -> dict:
        """``{key: value}`` of the filters that are on (``denoise``: :meth:`Denoise.active`)."""
        return {f.name: (getattr(self, f.name).active() if f.name == "denoise" else getattr(self, f.name))
                for f in fields(self) if f.name in FILTER_KEYS and getattr(self, f.name) is not None}


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


def drop_reason(score: float, rank: int, positive: float, filters: NegativeFilters, denoise_score: float = math.nan,
                denoise_positive: float = math.nan) -> str | None:
    """Which filter drops a candidate of ``score`` at ``rank`` (1-based, the run's rank) for a query whose
    reference positive scores ``positive`` (NaN: none retrieved), in :data:`FILTER_KEYS` order; None: kept.
    ``denoise_score``/``denoise_positive``: the cross-encoder's scores of the candidate and of the query's best
    positive (``denoise``; NaN: not scored, never dropped by it)."""
    if filters.range_min is not None and rank <= filters.range_min:
        return "range_min"
    if not math.isnan(score):
        if filters.max_score is not None and score > filters.max_score:
            return "max_score"
        if not math.isnan(positive):
            if filters.absolute_margin is not None and score > positive - filters.absolute_margin:
                return "absolute_margin"
            if filters.relative_margin is not None and score > relative_threshold(positive, filters.relative_margin):
                return "relative_margin"
    if filters.denoise is not None and denoise_score > filters.denoise.threshold(denoise_positive):
        return "denoise"
    return None


def drop_codes(scores: np.ndarray, ranks: np.ndarray, positive: float, filters: NegativeFilters,
               denoise_scores: np.ndarray | None = None, denoise_positive: float = math.nan) -> np.ndarray:
    """:func:`drop_reason` for a query's candidates at once: per candidate 0 (kept) or 1 + the index in
    :data:`FILTER_KEYS` of the first filter that drops it. ``denoise_scores``: the cross-encoder's, per candidate
    (needed when ``filters.denoise`` is on)."""
    codes = np.zeros(len(scores), dtype=np.int8)
    with np.errstate(invalid="ignore"):                     # NaN compares False: an unscored candidate stays
        masks = [ranks <= filters.range_min if filters.range_min is not None else None,
                 scores > filters.max_score if filters.max_score is not None else None]
        if not math.isnan(positive):
            masks += [scores > positive - filters.absolute_margin if filters.absolute_margin is not None else None,
                      scores > relative_threshold(positive, filters.relative_margin)
                      if filters.relative_margin is not None else None]
        else:
            masks += [None, None]
        if filters.denoise is not None:
            if denoise_scores is None or len(denoise_scores) != len(scores):
                raise ValueError("the denoise filter needs the cross-encoder's score of every candidate")
            masks.append(np.asarray(denoise_scores, dtype=np.float64) > filters.denoise.threshold(denoise_positive))
    for code, mask in enumerate(masks, start=1):
        if mask is not None:
            codes[(codes == 0) & mask] = code
    return codes


def filter_query(negative_ids: Sequence[str], negative_scores: Sequence[float], ranks: Sequence[int],
                 positive: float, filters: NegativeFilters, denoise_scores: Sequence[float] | None = None,
                 denoise_positive: float = math.nan) -> tuple[list[int], list[tuple[int, str]]]:
    """One query's candidates split into the indices kept and ``(index, reason)`` of those dropped, both in the
    candidates' order."""
    codes = drop_codes(np.asarray(negative_scores, dtype=np.float64), np.asarray(ranks, dtype=np.int64), positive,
                       filters, None if denoise_scores is None else np.asarray(denoise_scores, dtype=np.float64),
                       denoise_positive)
    return ([int(i) for i in np.flatnonzero(codes == 0)],
            [(int(i), FILTER_KEYS[codes[i] - 1]) for i in np.flatnonzero(codes)])


def threshold(reason: str, positive: float, filters: NegativeFilters, denoise_positive: float = math.nan) -> float:
    """The limit a candidate dropped by ``reason`` went past: the last rank skipped (range_min), else the highest
    score kept (denoise: the highest cross-encoder score kept)."""
    if reason == "range_min":
        return float(filters.range_min)
    if reason == "max_score":
        return float(filters.max_score)
    if reason == "absolute_margin":
        return positive - filters.absolute_margin
    if reason == "denoise":
        return filters.denoise.threshold(denoise_positive)
    return relative_threshold(positive, filters.relative_margin)


DROPPED_COLUMNS = ["query_id", "doc_id", "rank", "score", "positive_score", "reason", "threshold", "denoise_score",
                   "denoise_positive_score"]


def filter_pool(pool: pd.DataFrame, filters: NegativeFilters, keep: int,
                ranks: Sequence[Sequence[int]] | None = None, sample_size: int | None = None,
                seed: int = 0, denoise_scores: Sequence[Sequence[float]] | None = None,
                denoise_references: Sequence[float] | None = None) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """Apply ``filters`` to a candidate pool (negatives schema): the pool without the dropped candidates, the
    counts, and the dropped pairs (:data:`DROPPED_COLUMNS`; with ``sample_size``, only
    :func:`sample_dropped`'s draw of them, ``seed``, so that a large collection never holds them all).

    ``ranks``: per row, each candidate's rank in the run it came from (positives counted); None: its position in
    the list (1-based: official negatives). ``keep``: the negatives a query is asked for, to count the queries
    left with fewer (before and after the filters). ``denoise_scores`` and ``denoise_references`` (with
    ``filters.denoise`` on): per row, the cross-encoder's score of each candidate and of the query's best positive
    (:func:`dpr_pipeline.reranking.pool_scores.denoise_inputs`); the dropped pairs then carry them too
    (``denoise_score``, ``denoise_positive_score``; NaN otherwise).

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
    if filters.denoise is not None and (denoise_scores is None or denoise_references is None):
        raise ValueError("mining.<stage>.denoise is on: filter_pool needs the cross-encoder's scores of the pool")
    if filters.denoise is None:
        denoise_scores, denoise_references = None, None
    kept_ids, kept_scores, dropped_at = [], [], []       # dropped_at: (row, candidate indices, their codes)
    if not counts["filters"]:
        kept_ids, kept_scores = list(pool["negative_ids"]), list(pool["negative_scores"])
    else:
        for row, (ids, scores, query_ranks) in enumerate(zip(pool["negative_ids"], pool["negative_scores"], ranks)):
            codes = drop_codes(np.asarray(scores, dtype=np.float64), np.asarray(query_ranks, dtype=np.int64),
                               references[row], filters,
                               None if denoise_scores is None else np.asarray(denoise_scores[row], dtype=np.float64),
                               math.nan if denoise_references is None else float(denoise_references[row]))
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
                ce, ce_positive = ((math.nan, math.nan) if denoise_scores is None else
                                   (float(denoise_scores[row][i]), float(denoise_references[row])))
                rows.append((query_ids.iat[row], negative_ids.iat[row][i], int(ranks[row][i]), score, positive,
                             reason, threshold(reason, positive, filters, ce_positive), ce, ce_positive))
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
