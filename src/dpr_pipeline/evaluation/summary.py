"""One summary per dataset of every stage's metrics, laid out like the SimLM paper's Table 6.

Inputs are the stages' ``metrics.json`` files (``{split: {metric: value, "num_queries": n}}``) in pipeline
order. Outputs, written together atomically:

* ``summary.json``: ``{split: {stage: {metric: value}}}`` and, under ``paired_differences``,
  ``{split: {stage: {"below": stage, metric: {queries, mean, ci95, p_value, wins, losses}}}}``;
* a Markdown file with one table per split (rows = stages under their display labels, columns = metrics,
  values with 4 decimals), and under it each stage's difference from the stage below it in the chain
  (``STAGE_BELOW``), paired over the split's queries (:mod:`dpr_pipeline.evaluation.paired_difference`): the mean ± the
  half-width of its 95 % confidence interval, marked where the paired t-test rejects no difference;
* under each split's tables, a verdict in plain words on the headline metric (nDCG@10 where evaluated, else the
  split's first metric): which trained stages are not above the stage below them, and where the chain ended
  against the model it started from (the last bi-encoder against ``start``); the same goes to the log, as a
  warning for a stage that did not beat the one below it;
* what each trained stage handed on, chosen on the dev split (``selections``: the bi-encoders'
  dev_selection.json, :mod:`dpr_pipeline.training.selection_record`; the re-ranker's fusion choice, where its weight was
  chosen on dev): a section of the Markdown, ``dev_selection`` in the JSON, and a warning in the log for a stage
  that did not beat its start, whose start went on instead;
* a PNG with one grouped bar chart per split (one group per metric, one bar per stage).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.metrics import NOT_SPLITS, PER_QUERY
from dpr_pipeline.evaluation.paired_difference import CONFIDENCE, paired_difference
from dpr_pipeline.reranking.score_fusion import describe_fusion_choice
from dpr_pipeline.training.selection_record import START as START_HANDED_ON
from dpr_pipeline.training.selection_record import describe, read_selection
from dpr_pipeline.stages import BIENCODER, CROSS_ENCODER, STAGE_BELOW, STAGE_LABELS, chain, starting_stage

log = logging.getLogger(__name__)

#: summary.json's key for the paired differences (not a split).
PAIRED_DIFFERENCES = "paired_differences"
#: summary.json's key for what each trained stage handed on, chosen on dev (not a split).
DEV_SELECTION = "dev_selection"
QUERY_COUNT = "num_queries"
MISSING = "–"
#: The metric the verdict reads where a split has it (else the split's first metric).
HEADLINE_METRIC = "nDCG@10"
#: The stage the chain started from: the verdict reads the last bi-encoder of the chain against it.
START = starting_stage()
#: The re-ranker, whose counterpart of a dev selection is its fusion weight chosen on dev.
(RERANKER,) = chain(CROSS_ENCODER)

Summary = dict[str, dict[str, dict[str, float]]]
PerQuery = dict[str, dict[str, dict[str, float]]]  # {split: {metric: {query_id: value}}}


def read_metrics(path: str | Path) -> dict[str, dict[str, float]]:
    """A stage's metrics.json as ``{split: {metric: value}}`` (its ``counts``, ``per_query`` and ``provenance``
    left out)."""
    return {split: values for split, values in _read_metrics_file(path).items() if split not in NOT_SPLITS}


def read_per_query(path: str | Path) -> PerQuery:
    """A stage's per-query values, ``{split: {metric: {query_id: value}}}`` (empty for a metrics.json written
    before they were recorded)."""
    return _read_metrics_file(path).get(PER_QUERY, {})


def _read_metrics_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "metrics file not found", "run the stage's evaluate rule")
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(path, f"not valid JSON ({err})", "delete it and rerun the stage's evaluate rule") from None
    if not isinstance(metrics, dict) or not all(isinstance(v, dict) for v in metrics.values()):
        raise DataError(path, "not a {split: {metric: value}} object", "delete it and rerun the evaluate rule")
    return metrics


def collect_summary(metrics_paths: dict[str, str | Path]) -> Summary:
    """``{split: {stage: {metric: value}}}``, splits in first-seen order and stages in the given order."""
    summary: Summary = {}
    for stage, path in metrics_paths.items():
        for split, values in read_metrics(path).items():
            summary.setdefault(split, {})[stage] = values
    return summary


def paired_differences(metrics_paths: dict[str, str | Path]) -> dict[str, dict[str, dict]]:
    """``{split: {stage: {"below": stage below, metric: PairedDifference}}}`` for each stage of ``metrics_paths``
    whose stage below (``STAGE_BELOW``) is there too, over the splits and metrics both have per-query values of."""
    per_query = {stage: read_per_query(path) for stage, path in metrics_paths.items()}
    differences: dict[str, dict[str, dict]] = {}
    for stage, by_split in per_query.items():
        below = STAGE_BELOW.get(stage)
        if below not in per_query:
            continue
        for split, by_metric in by_split.items():
            lower = per_query[below].get(split, {})
            try:
                compared = {metric: paired_difference(values, lower[metric])
                            for metric, values in by_metric.items() if metric in lower}
            except ValueError as err:
                raise DataError(metrics_paths[stage], f"split {split!r} against {metrics_paths[below]}: {err}",
                                "evaluate both stages on the same split's qrels (rerun their evaluate rules)") from None
            if compared:
                differences.setdefault(split, {})[stage] = {"below": below, **compared}
    return differences


def differences_table(by_stage: dict[str, dict], labels: dict[str, str]) -> str:
    """The paired differences of one split as Markdown: a row per stage, a column per metric."""
    names = list(dict.fromkeys(name for compared in by_stage.values() for name in compared if name != "below"))
    queries = {difference.queries for compared in by_stage.values() for name, difference in compared.items()
               if name != "below"}
    over = f"the {queries.pop()} queries" if len(queries) == 1 else "each split's queries"
    lines = [f"Difference from the stage below, paired over {over}: mean ± half-width of the 95 % confidence "
             f"interval; † where the paired t-test gives p < {1 - CONFIDENCE:.2f}. A difference inside its interval "
             "is not a result.", "",
             "| stage | − stage below | " + " | ".join(names) + " |", "| --- | --- |" + " ---: |" * len(names)]
    for stage, compared in by_stage.items():
        cells = [MISSING if name not in compared else
                 f"{compared[name].mean:+.4f} ± {compared[name].ci95:.4f}{' †' if compared[name].significant else ''}"
                 for name in names]
        lines.append(f"| {labels.get(stage, stage)} | {labels.get(compared['below'], compared['below'])} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def metric_names(by_stage: dict[str, dict[str, float]]) -> list[str]:
    """Every metric of a split's stages, in first-seen order, without the query count."""
    names = dict.fromkeys(name for values in by_stage.values() for name in values if name != QUERY_COUNT)
    return list(names)


def _query_count_note(by_stage: dict[str, dict[str, float]], labels: dict[str, str]) -> str:
    counts = {stage: values[QUERY_COUNT] for stage, values in by_stage.items() if QUERY_COUNT in values}
    if not counts:
        return ""
    if len(set(counts.values())) == 1:
        return f" ({next(iter(counts.values()))} queries)"
    return " (queries: " + ", ".join(f"{labels[stage]} {n}" for stage, n in counts.items()) + ")"


def _cell(value: float | None) -> str:
    return MISSING if value is None else f"{value:.4f}"


def markdown_table(by_stage: dict[str, dict[str, float]], labels: dict[str, str]) -> str:
    names = metric_names(by_stage)
    lines = ["| stage | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for stage, values in by_stage.items():
        lines.append(f"| {labels[stage]} | " + " | ".join(_cell(values.get(n)) for n in names) + " |")
    return "\n".join(lines)


def headline_metric(by_stage: dict[str, dict[str, float]]) -> str | None:
    """The metric a split's verdict reads: :data:`HEADLINE_METRIC` where evaluated, else the first one."""
    names = metric_names(by_stage)
    return HEADLINE_METRIC if HEADLINE_METRIC in names else (names[0] if names else None)


def verdict(by_stage: dict[str, dict[str, float]]) -> dict | None:
    """On a split's headline metric: each trained stage's change from the stage below it (``STAGE_BELOW``, where
    both are in the summary), the stages not above it, and the last bi-encoder of the chain against ``start``.

    ``{"metric": m, "changes": {stage: (below, change)}, "not_above": [stage, ...], "end_to_end": (last, change)
    or None}``; None where the split has no metric or no pair to compare."""
    metric = headline_metric(by_stage)
    if metric is None:
        return None
    value = {stage: values[metric] for stage, values in by_stage.items() if metric in values}
    changes = {stage: (below, value[stage] - value[below]) for stage, below in STAGE_BELOW.items()
               if stage in value and below in value}
    last = next((stage for stage in reversed(chain(BIENCODER)) if stage in value), None)
    end_to_end = (last, value[last] - value[START]) if last not in (None, START) and START in value else None
    if not changes and end_to_end is None:
        return None
    return {"metric": metric, "changes": changes, "not_above": [s for s, (_, change) in changes.items() if change <= 0],
            "end_to_end": end_to_end}


def render_verdict(found: dict, labels: dict[str, str]) -> str:
    """A split's :func:`verdict` in two plain sentences."""
    metric, changes = found["metric"], found["changes"]
    lines = []
    if found["not_above"]:
        lines.append(f"**Not above the stage below ({metric}):** " + "; ".join(
            f"{labels.get(stage, stage)} {changes[stage][1]:+.4f} against {labels.get(changes[stage][0], changes[stage][0])}"
            for stage in found["not_above"]) + ". Such a stage hands on a model no better than the one it improves on.")
    elif changes:
        lines.append(f"Every trained stage is above the stage below it on {metric} (" + ", ".join(
            f"{labels.get(stage, stage)} {change:+.4f}" for stage, (_, change) in changes.items()) + ").")
    if found["end_to_end"] is not None:
        last, change = found["end_to_end"]
        where = "above" if change > 0 else "NOT above"
        lines.append(f"{labels.get(last, last)} ends {change:+.4f} {metric} against "
                     f"{labels.get(START, START)}: {where} the model the chain started from.")
    return " ".join(lines)


def render_markdown(summary: Summary, labels: dict[str, str], title: str = "Retrieval quality by stage",
                    differences: dict[str, dict[str, dict]] | None = None) -> str:
    sections = [f"# {title}"]
    for split, by_stage in summary.items():
        sections.append(f"## {split}{_query_count_note(by_stage, labels)}\n\n{markdown_table(by_stage, labels)}")
        if (differences or {}).get(split):
            sections.append(differences_table(differences[split], labels))
        found = verdict(by_stage)
        if found is not None:
            sections.append(render_verdict(found, labels))
    return "\n\n".join(sections) + "\n"


def log_verdicts(summary: Summary, labels: dict[str, str]) -> None:
    """Each split's verdict in the log: a warning where a stage is not above the stage below it, or the chain
    ends at or below its start."""
    for split, by_stage in summary.items():
        found = verdict(by_stage)
        if found is None:
            continue
        bad = found["not_above"] or (found["end_to_end"] is not None and found["end_to_end"][1] <= 0)
        (log.warning if bad else log.info)("%s: %s", split, render_verdict(found, labels))


def plot_summary(summary: Summary, labels: dict[str, str], output: Path) -> None:
    """One grouped bar chart per split: a group per metric, a bar per stage (``labels`` in pipeline order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {stage: f"C{i}" for i, stage in enumerate(labels)}  # a stage keeps its colour in every split
    widest = max((len(metric_names(by_stage)) for by_stage in summary.values()), default=1)
    fig, axes = plt.subplots(max(1, len(summary)), 1, figsize=(2.0 + 1.8 * widest, 3.8 * max(1, len(summary))),
                             squeeze=False)
    for ax, (split, by_stage) in zip(axes[:, 0], summary.items()):
        names = metric_names(by_stage)
        width = 0.8 / max(1, len(by_stage))
        for i, (stage, values) in enumerate(by_stage.items()):
            heights = [values.get(n, np.nan) for n in names]
            bars = ax.bar(np.arange(len(names)) + i * width, heights, width, label=labels[stage],
                          color=colors[stage])
            ax.bar_label(bars, labels=[f"{values[n]:.3f}" if n in values else "" for n in names], fontsize=7)
        ax.set_xticks(np.arange(len(names)) + width * (len(by_stage) - 1) / 2, names)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{split}{_query_count_note(by_stage, labels)}")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(output, format="png", dpi=120)
    plt.close(fig)


def read_selections(selections: dict[str, str | Path], fusion_choice: str | Path | None = None) -> dict[str, dict]:
    """Each trained stage's choice on dev, in pipeline order: the bi-encoders' dev_selection.json files
    (``selections``, by stage) and the re-ranker's fusion_weight.json (``fusion_choice``), marked
    ``"fusion": true``."""
    records = {stage: read_selection(path) for stage, path in selections.items()}
    if fusion_choice is not None:
        records[RERANKER] = {"fusion": True, **json.loads(Path(fusion_choice).read_text(encoding="utf-8"))}
    return {stage: records[stage] for stage in chain() if stage in records}


def selection_sentences(records: dict[str, dict], labels: dict[str, str]) -> list[tuple[str, bool]]:
    """(sentence, whether the stage's start went on instead) per stage, in the given order."""
    sentences = []
    for stage, record in records.items():
        if record.get("fusion"):
            below = STAGE_BELOW[stage]
            sentence = describe_fusion_choice(record, labels.get(stage, STAGE_LABELS[stage]),
                                              STAGE_LABELS[below])
            sentences.append((sentence, float(record["weight"]) == 0))
        else:
            sentences.append((describe(record), record["handed_on"] == START_HANDED_ON))
    return sentences


def render_selections(records: dict[str, dict], labels: dict[str, str]) -> str:
    """The Markdown section on what each trained stage handed on."""
    return ("## What each trained stage handed on (chosen on the dev split)\n\n"
            + "\n".join(f"* {sentence}" for sentence, _ in selection_sentences(records, labels)))


def write_summary(metrics_paths: dict[str, str | Path], output_json: str | Path, output_markdown: str | Path,
                  output_png: str | Path, *, labels: dict[str, str] | None = None,
                  title: str = "Retrieval quality by stage",
                  selections: dict[str, str | Path] | None = None,
                  fusion_choice: str | Path | None = None) -> Summary:
    """Summarise the stages' metrics.json files (stage name -> path, in pipeline order) as JSON, Markdown, PNG.

    ``labels`` override the display labels of ``STAGE_LABELS``; a stage without a label shows its name.
    ``selections`` (bi-encoders' dev_selection.json by stage) and ``fusion_choice`` (the re-ranker's
    fusion_weight.json, where chosen on dev): what each trained stage handed on (:func:`read_selections`).
    The pre-training ablation uses the same layout with one row per method.
    """
    display = {stage: {**STAGE_LABELS, **(labels or {})}.get(stage, stage) for stage in metrics_paths}
    summary = collect_summary(metrics_paths)
    differences = paired_differences(metrics_paths)
    as_json = {split: {stage: {key: value if key == "below" else value.as_dict() for key, value in compared.items()}
                       for stage, compared in by_stage.items()} for split, by_stage in differences.items()}
    records = read_selections(selections or {}, fusion_choice)
    markdown = render_markdown(summary, display, title, differences)
    if records:
        markdown += "\n" + render_selections(records, display) + "\n"
    with atomic_outputs(output_json, output_markdown, output_png) as (json_tmp, markdown_tmp, png_tmp):
        json_tmp.write_text(json.dumps({**summary, **({PAIRED_DIFFERENCES: as_json} if as_json else {}),
                                        **({DEV_SELECTION: records} if records else {})}, indent=2)
                            + "\n", encoding="utf-8")
        markdown_tmp.write_text(markdown, encoding="utf-8")
        plot_summary(summary, display, png_tmp)
    log_verdicts(summary, display)
    for sentence, start_went_on in selection_sentences(records, display):
        (log.warning if start_went_on else log.info)("%s", sentence)
    log.info("summary of %d stages over %d splits written to %s", len(metrics_paths), len(summary), output_markdown)
    return summary
