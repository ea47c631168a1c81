"""A bi-encoder stage's dev selection record (``dev_selection.json``): which model it handed on, the trained one or
its start, with both scores; written by the training job (:mod:`dpr_pipeline.training.dev_selection`), read by the
model card and the summary, which need no encoder to read it."""

from __future__ import annotations

import json
from pathlib import Path

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.errors import DataError
from dpr_pipeline.training.settings import BiEncoderSettings, DevSelectionSettings

TRAINED = "trained"
START = "start"


def choose(trained: float, start: float) -> str:
    """:data:`TRAINED` when the trained model scores above its start, else :data:`START`."""
    return TRAINED if trained > start else START


def scoring(chosen: DevSelectionSettings, settings: BiEncoderSettings) -> dict:
    """How the candidates were scored, for the record."""
    return {"split": chosen.split, "metric": chosen.metric, "depth": chosen.depth,
            "relevance_level": chosen.relevance_level, "query_max_length": settings.query_max_length,
            "passage_max_length": settings.passage_max_length}


def selection_record(*, label: str, start_label: str, start_model: str, handed_on: str,
                     settings: dict | None = None, trained: float | None = None, start: float | None = None,
                     queries: int | None = None, passages: int | None = None, paired=None,
                     start_score_from: str | None = None, reason: str | None = None) -> dict:
    """dev_selection.json: the candidates' scores (their mean over the ``queries`` dev queries, each searched in
    the whole corpus of ``passages``), the paired difference trained − start over those queries (``paired``, a
    :class:`~dpr_pipeline.evaluation.paired_difference.PairedDifference`; None for one query) and the one handed on;
    without a dev score, ``reason`` says why the trained model went on unchecked."""
    record = {"stage": label, "handed_on": handed_on, "start": start_label, "start_model": start_model}
    if reason is not None:
        return {**record, "reason": reason}
    return {**record, **settings, "trained_score": trained, "start_score": start, "difference": trained - start,
            "handed_on_score": trained if handed_on == TRAINED else start,
            "searched": {"queries": queries, "passages": passages},
            "paired": paired.as_dict() if paired is not None else None,
            "resolved": bool(paired is not None and paired.significant), "start_score_from": start_score_from}


def describe(record: dict) -> str:
    """One sentence on a stage's choice, for the job's log, the model card and the summary."""
    label, start_label = record["stage"], record["start"]
    if "reason" in record:
        if record["handed_on"] == START:
            return f"{label} was not trained: {record['reason']}; its start ({start_label}) was handed on."
        return f"{label}: the trained model was handed on without a dev check ({record['reason']})."
    searched, paired = record["searched"], record.get("paired")
    change = f"{record['difference']:+.4f} {record['metric']} over its {searched['queries']} queries, each " \
             f"searched in the whole corpus of {searched['passages']} passages"
    if paired is not None:
        change += f"; 95 % interval ±{paired['ci95']:.4f}"
    if record["handed_on"] == START:
        choice = f"{label} is not above its start ({start_label}) on {record['split']} ({change}): its start was " \
                 "handed on."
    else:
        choice = f"{label} is above its start ({start_label}) on {record['split']} ({change}): the trained model " \
                 "was handed on."
    if not record.get("resolved"):
        choice += f" The {searched['queries']} {record['split']} queries do not resolve this difference (paired " \
                  "t-test, 95 %): a larger dev split would (dev_split.fraction, docs/datasets.md)."
    return choice


def teacher_below_start(teacher_metrics: str | Path, start_metrics: str | Path, split: str,
                        metric: str) -> tuple[float, float] | None:
    """(teacher, start) dev scores from the two stages' metrics.json where the teacher is not above the student's
    start on ``split`` in ``metric`` (a student distilled from it would learn nothing better than it starts
    with), else None."""
    scores = []
    for path in (teacher_metrics, start_metrics):
        try:
            scores.append(float(json.loads(Path(path).read_text(encoding="utf-8"))[split][metric]))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(path, f"has no {split} {metric} to compare the teacher with the student's start "
                                  f"({err!r})", "rerun the stage's evaluate job") from None
    return None if scores[0] > scores[1] else (scores[0], scores[1])


def write_selection(path: str | Path, record: dict) -> None:
    """Write a stage's dev_selection.json."""
    with atomic_output(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_selection(path: str | Path) -> dict:
    """A stage's dev_selection.json."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(path, f"cannot be read as a dev selection record ({err})",
                        "rerun the stage's training job") from None
