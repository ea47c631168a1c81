"""The re-ranked run's score: the re-ranker's θ(q, d) fused with the first stage's score s(q, d).

Over each query's re-ranked hits (the first stage's top ``rerank_depth``), both scores are standardised per
query (z = (x − mean) / sd; a query whose scores are all equal gets z = 0) and mixed:

    score(q, d) = w · z(θ(q, d)) + (1 − w) · z(s(q, d))

``w = 1`` ranks by the re-ranker alone (the SimLM paper's re-ranker); ``w = 0`` keeps the first stage's order.
A cross-encoder trained on a small budget ranks differently from the bi-encoder it re-ranks, and a mix often
beats both (the interpolation of re-ranker and first-stage scores that re-ranking studies report); how much of
each is a setting, ``reranker.fusion_weight``: a number, or ``dev``, the weight of :data:`FUSION_GRID` with the
best dev-split ``reranker.fusion_metric`` (:func:`choose_fusion_weight`; a tie goes to the larger weight, the
re-ranker's side) where the dev split resolves its paired difference from the equal mix
(:data:`UNRESOLVED_WEIGHT`), else the equal mix (docs/datasets.md, "What a small dev split cannot choose"). The
hits below the re-ranked depth follow in the first stage's order (:func:`.runs.append_tail`).

:func:`weight_setting` is the one reader of the setting's value: the config's check, the jobs' parameters
(:func:`dpr_pipeline.orchestration.stage_settings.fusion`), the rules' inputs and the jobs (:func:`mixing_weight`) ask it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.data.trec_runs import append_tail, rank_order, read_trec_run, write_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.metrics import per_query_metrics
from dpr_pipeline.evaluation.paired_difference import paired_difference
from dpr_pipeline.layout import stage_file

#: The weights ``fusion_weight: dev`` chooses from: 0, 0.1, …, 1.
FUSION_GRID = tuple(i / 10 for i in range(11))
#: The ``reranker.fusion_weight`` that has the weight chosen on the dev split (:func:`choose_fusion_weight`).
CHOSEN_ON_DEV = "dev"
#: The weight ``dev`` keeps where the dev split does not resolve the best weight's difference from it: both
#: rankers' standardised scores at equal weight (docs/datasets.md, "What a small dev split cannot choose").
UNRESOLVED_WEIGHT = 0.5


def weight_setting(setting: float | str, dataset: str) -> dict:
    """What ``reranker.fusion_weight`` stands for in ``dataset``'s jobs: ``{"value": w, "choice": None}`` for a
    number w; for ``dev``, ``{"value": None, "choice": "results/<dataset>/reranker/fusion_weight.json"}``, the file
    that records the weight chosen on the dev split (:func:`write_fusion_choice`): an input of the jobs that mix,
    which read the weight there (:func:`mixing_weight`)."""
    if setting == CHOSEN_ON_DEV:
        return {"value": None, "choice": stage_file("reranker", "fusion_weight.json", dataset)}
    return {"value": float(setting), "choice": None}


def standardised(scores: pd.Series, groups: pd.Series) -> pd.Series:
    """Each score minus its group's mean, over the group's standard deviation (population); 0 where a group's
    scores are all equal (a spread within float rounding of the mean)."""
    grouped = scores.groupby(groups)
    mean = grouped.transform("mean")
    spread = grouped.transform("std", ddof=0)
    return ((scores - mean) / spread.where(spread > 1e-9 * (1.0 + mean.abs()))).fillna(0.0)


def mixed(reranker: pd.Series, first_stage: pd.Series, weight: float) -> pd.Series:
    """``w · reranker + (1 − w) · first_stage`` of two standardised scores."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"the fusion weight must be in [0, 1], got {weight}")
    return weight * reranker + (1.0 - weight) * first_stage


def fused_scores(hits: pd.DataFrame, weight: float) -> pd.Series:
    """``w · z(reranker) + (1 − w) · z(first_stage)`` for hits with columns query_id, reranker, first_stage."""
    return mixed(standardised(hits["reranker"], hits["query_id"]),
                 standardised(hits["first_stage"], hits["query_id"]), weight)


def reranked_hits(reranker_run: pd.DataFrame, first_stage_run: pd.DataFrame, depth: int, *,
                  reranker_path: str | Path = "re-ranker run", first_stage_path: str | Path = "first-stage run"
                  ) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The first stage's top ``depth`` hits of each query with both scores (query_id, doc_id, reranker,
    first_stage), and each query's remaining hits (doc ids in the first stage's order). The re-ranker run must
    have re-scored exactly those hits: its first ``depth`` hits per query."""
    below = first_stage_run.groupby("query_id").cumcount() >= depth
    tails = {qid: group["doc_id"].tolist() for qid, group in first_stage_run[below].groupby("query_id", sort=False)}
    rescored = reranker_run[reranker_run.groupby("query_id").cumcount() < depth]
    hits = first_stage_run.loc[~below, ["query_id", "doc_id", "score"]].rename(columns={"score": "first_stage"}).merge(
        rescored[["query_id", "doc_id", "score"]].rename(columns={"score": "reranker"}),
        on=["query_id", "doc_id"], how="outer", indicator=True)
    stray = hits[hits["_merge"] != "both"]
    if len(stray):
        hit = stray.iloc[0]
        where = first_stage_path if hit["_merge"] == "left_only" else reranker_path
        raise DataError(reranker_path, f"query {hit['query_id']!r}: document {hit['doc_id']!r} is among the top "
                        f"{depth} of {where} only, so the re-ranker did not re-score the first stage's top {depth}",
                        f"re-rank {first_stage_path} again with rerank_depth {depth} (delete this run and rerun)")
    return hits.drop(columns="_merge").reset_index(drop=True), tails


def _ranked(hits: pd.DataFrame, scores: pd.Series, tails: dict[str, list[str]]
            ) -> list[tuple[str, list[tuple[str, float]]]]:
    """``(query_id, hits)``: each query's hits by ``scores``, then its tail below them."""
    scored = hits.assign(score=scores)
    return [(qid, append_tail(rank_order(zip(group["doc_id"], group["score"].astype(float))), tails.get(qid, [])))
            for qid, group in scored.groupby("query_id", sort=True)]


def fuse_runs(reranker_run: pd.DataFrame, first_stage_run: pd.DataFrame, *, weight: float, depth: int,
              **paths) -> list[tuple[str, list[tuple[str, float]]]]:
    """``(query_id, hits)`` of the fused run: the top ``depth`` by the fused score, then the first stage's
    remaining hits in its order, below them. ``paths``: the runs' paths for errors (:func:`reranked_hits`)."""
    hits, tails = reranked_hits(reranker_run, first_stage_run, depth, **paths)
    return _ranked(hits, fused_scores(hits, weight), tails)


def choose_fusion_weight(reranker_run: pd.DataFrame, first_stage_run: pd.DataFrame, qrels: pd.DataFrame, *,
                         depth: int, metric: str, relevance_level: int = 1, grid=FUSION_GRID,
                         qrels_source: str = "qrels", **paths) -> dict:
    """The weight the re-ranked runs mix at, chosen on ``qrels``' queries: ``{"weight", "best", "metric",
    "values": {weight: value}, "against_equal_mix", "resolved"}``. ``best`` is the weight of ``grid`` whose fused
    run scores best in ``metric`` (ties: the larger weight); ``weight`` is ``best`` where the queries resolve its
    paired difference from :data:`UNRESOLVED_WEIGHT` (``against_equal_mix``, a paired t-test at 95 %:
    ``resolved``), else :data:`UNRESOLVED_WEIGHT`. The hits are matched and standardised once, then mixed at each
    weight."""
    hits, tails = reranked_hits(reranker_run, first_stage_run, depth, **paths)
    z_reranker = standardised(hits["reranker"], hits["query_id"])
    z_first_stage = standardised(hits["first_stage"], hits["query_id"])
    per_query = {}
    for weight in dict.fromkeys((*grid, UNRESOLVED_WEIGHT)):
        fused = pd.DataFrame([(qid, doc, score) for qid, ranked in _ranked(hits, mixed(z_reranker, z_first_stage,
                                                                                       weight), tails)
                              for doc, score in ranked], columns=["query_id", "doc_id", "score"])
        table = per_query_metrics(fused, qrels, [metric], qrels_source, relevance_level)[metric]
        per_query[float(weight)] = {str(query): float(value) for query, value in table.items()}
    values = {float(weight): float(np.mean(list(per_query[float(weight)].values()))) for weight in grid}
    best = max(values, key=lambda weight: (values[weight], weight))
    against = (paired_difference(per_query[best], per_query[UNRESOLVED_WEIGHT])
               if best != UNRESOLVED_WEIGHT and len(per_query[best]) > 1 else None)
    resolved = best == UNRESOLVED_WEIGHT or (against is not None and against.significant and against.mean > 0)
    return {"weight": best if resolved else UNRESOLVED_WEIGHT, "best": best, "metric": metric, "values": values,
            "against_equal_mix": against.as_dict() if against is not None else None, "resolved": resolved}


def write_fusion_choice(reranker_run: str | Path, first_stage_run: str | Path, qrels: str | Path,
                        output: str | Path, *, depth: int, metric: str, relevance_level: int = 1,
                        split: str) -> dict:
    """:func:`choose_fusion_weight` on a dev split's runs and qrels files, written as JSON (with the split and
    the files it was chosen on)."""
    choice = choose_fusion_weight(read_trec_run(reranker_run), read_trec_run(first_stage_run),
                                  read_artifact(qrels, "qrels"), depth=depth, metric=metric,
                                  relevance_level=relevance_level, qrels_source=str(qrels),
                                  reranker_path=reranker_run, first_stage_path=first_stage_run)
    record = {**choice, "values": {f"{w:g}": v for w, v in choice["values"].items()}, "split": split,
              "depth": depth, "chosen_on": {"reranker_run": str(reranker_run),
                                            "first_stage_run": str(first_stage_run), "qrels": str(qrels)}}
    with atomic_output(output) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2) + "\n")
    return record


def describe_fusion_choice(choice: dict, label: str, first_stage_label: str) -> str:
    """One sentence on a fusion weight chosen on dev (:func:`write_fusion_choice`'s record): weight 0 is the
    re-ranker not beating the run it re-ranks, whose order then goes on; a best weight the dev split does not
    resolve from the equal mix leaves the equal mix."""
    values = choice["values"]
    weight = float(choice["weight"])
    change = f"{values[f'{weight:g}'] - values['0']:+.4f} {choice['metric']} on {choice['split']}"
    if not choice.get("resolved", True):   # a record written before the check has no "resolved": its weight stood
        against = choice["against_equal_mix"]
        return (f"{choice['split']} does not resolve the best fusion weight {float(choice['best']):g} from the equal "
                f"mix ({against['mean']:+.4f} ± {against['ci95']:.4f} {choice['metric']}, {against['queries']} "
                f"queries): {label}'s re-ranked runs mix it in at weight {weight:g} ({change} over "
                f"{first_stage_label}).")
    if weight == 0:
        return (f"{label} did not beat its start ({first_stage_label}) on {choice['split']} (at best "
                f"{max(v for w, v in values.items() if w != '0') - values['0']:+.4f} {choice['metric']}): "
                f"{first_stage_label}'s order was handed on (fusion weight 0).")
    return (f"{label} is above its start ({first_stage_label}) on {choice['split']} ({change}): its re-ranked runs "
            f"mix it in at fusion weight {weight:g}.")


def fused_teacher_scores(teacher: pd.DataFrame, first_stage: pd.DataFrame, weight: float, *,
                         teacher_path: str | Path = "teacher scores",
                         first_stage_path: str | Path = "first-stage negatives") -> tuple[pd.DataFrame, int]:
    """The teacher's scores of a negatives artifact's pairs fused with the first stage's scores of the same pairs,
    as the re-ranked runs fuse them, on the teacher's scale: per query, over the pairs the teacher scored,
    ``mean(θ) + sd(θ) · (w · z(θ) + (1 − w) · z(s))`` (``w = 1`` gives θ back), so a student distilled from it
    learns the ranking the re-ranked runs are evaluated on. A pair the teacher did not score keeps none (NaN).

    ``first_stage``: the negatives artifact the teacher scored (the same rows, ids and order; else a DataError
    naming the first differing row), whose scores are the first stage's. A positive the first stage did not
    retrieve has no score there; it gets the lowest score the first stage gave the query (its score is at most
    that). Returns the fused artifact and how many positives were so bounded."""
    if len(teacher) != len(first_stage):
        raise DataError(teacher_path, f"{len(teacher)} rows against {len(first_stage)} in {first_stage_path}",
                        "score the same negatives artifact with the teacher (teacher_scores rule)")
    for column in ("query_id", "positive_ids", "negative_ids"):
        same = [a == b if column == "query_id" else len(a) == len(b) and all(np.asarray(a) == np.asarray(b))
                for a, b in zip(teacher[column], first_stage[column])]
        if not all(same):
            row = same.index(False) + 1
            raise DataError(teacher_path, f"its {column} differ from {first_stage_path}'s",
                            "score the same negatives artifact with the teacher (teacher_scores rule)", row=row)
    sides = ("positive_scores", "negative_scores")
    lengths = [teacher[side].map(len).to_numpy() for side in sides]
    rows = np.concatenate([np.repeat(np.arange(len(teacher)), n) for n in lengths])
    theta = np.concatenate([np.concatenate([*teacher[side], []]).astype(np.float64) for side in sides])
    first = np.concatenate([np.concatenate([*first_stage[side], []]).astype(np.float64) for side in sides])
    lowest = pd.Series(first).groupby(rows).transform("min").to_numpy()
    unscored = np.isnan(first)
    bounded = int((unscored & ~np.isnan(theta)).sum())
    first = np.where(unscored, lowest, first)
    scored = ~np.isnan(theta) & ~np.isnan(first)
    pairs = pd.DataFrame({"row": rows[scored], "theta": theta[scored], "first": first[scored]})
    grouped = pairs.groupby("row")["theta"]
    fused = np.full(len(theta), np.nan)
    fused[scored] = (grouped.transform("mean") + grouped.transform("std", ddof=0) * mixed(
        standardised(pairs["theta"], pairs["row"]), standardised(pairs["first"], pairs["row"]), weight)).to_numpy()
    positives = fused[:lengths[0].sum()]
    negatives = fused[lengths[0].sum():]
    out = teacher.copy()
    for side, values, counts in zip(sides, (positives, negatives), lengths):
        out[side] = np.split(values, np.cumsum(counts)[:-1]) if len(counts) else []
    return out, bounded


def write_fused_teacher_scores(teacher_path: str | Path, first_stage_path: str | Path, output: str | Path, *,
                               weight: float) -> int:
    """:func:`fused_teacher_scores` of two negatives artifacts, written as one; returns how many positives had
    no first-stage score."""
    fused, bounded = fused_teacher_scores(read_artifact(teacher_path, "negatives"),
                                          read_artifact(first_stage_path, "negatives"), weight,
                                          teacher_path=teacher_path, first_stage_path=first_stage_path)
    write_artifact(fused, output, "negatives", metadata={"source": f"teacher fused with the first stage at {weight:g}"})
    return bounded


def read_fusion_weight(path: str | Path) -> float:
    """The weight a fusion choice file (:func:`write_fusion_choice`) records."""
    try:
        return float(json.loads(Path(path).read_text())["weight"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(path, f"not a fusion choice file ({err})", "delete it and rerun choose_fusion_weight") \
            from None


def mixing_weight(weight: dict) -> float:
    """The weight a job mixes with, given :func:`weight_setting`'s record: its value, or the one its choice file
    records."""
    return weight["value"] if weight["choice"] is None else read_fusion_weight(weight["choice"])


def write_fused_run(reranker_run: str | Path, first_stage_run: str | Path, output: str | Path, *, weight: float,
                    depth: int, tag: str) -> None:
    """The fused run (:func:`fuse_runs`) of two TREC run files, written as a TREC run."""
    write_trec_run(fuse_runs(read_trec_run(reranker_run), read_trec_run(first_stage_run), weight=weight,
                             depth=depth, reranker_path=reranker_run, first_stage_path=first_stage_run),
                   output, tag)
