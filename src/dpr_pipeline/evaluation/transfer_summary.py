"""The zero-shot transfer summary of one training dataset A, laid out like CDMAE's Table 3 (BEIR).

Inputs, per target collection B: B's own BM25 ``metrics.json`` (the baseline column) and, per stage of A, the
``metrics.json`` of A's model evaluated on B (``results/{A}/{stage}/transfer/{B}/metrics.json``), each
``{split: {metric: value, "num_queries": n}}``. Outputs, written together atomically:

* ``transfer_summary.json``: ``{"source", "metric", "columns", "rows": {row: {column: value}},
  "average": {column: value}, "collections": {B: {split: {column: {metric: value}}}}, "lengths": {B: {column:
  {"query": tokens, "passage": tokens} | {"pair": tokens}}}}`` (every metric kept; ``lengths``: what each model
  cut B's texts at, :func:`used_lengths`);
* a Markdown table: one row per collection (``B`` when B has one evaluation split, ``B (split)`` per split
  otherwise), the ``Average`` row (mean over the rows), one column per stage, cells = ``metric``; then the
  lengths, one row per collection;
* a PNG: one group of bars per row (the average last), one bar per column.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from dpr_pipeline.atomic_writes import atomic_output, atomic_outputs
from dpr_pipeline.data.ingest import check_overlap
from dpr_pipeline.data.records import Location
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.summary import MISSING, QUERY_COUNT, read_metrics
from dpr_pipeline.models.refs import max_seq_length
from dpr_pipeline.stages import STAGE_LABELS

log = logging.getLogger(__name__)

AVERAGE = "Average"

Collections = dict[str, dict[str, dict[str, dict[str, float]]]]  # {target: {split: {column: {metric: value}}}}


def collect_transfer(metrics_paths: dict[str, dict[str, str | Path]]) -> Collections:
    """``{target: {split: {column: metrics}}}`` from ``{target: {column: metrics.json path}}`` (orders kept)."""
    collections: Collections = {}
    for target, by_column in metrics_paths.items():
        splits: dict[str, dict[str, dict[str, float]]] = {}
        for column, path in by_column.items():
            for split, values in read_metrics(path).items():
                splits.setdefault(split, {})[column] = values
        collections[target] = splits
    return collections


def transfer_table(collections: Collections, columns: list[str], metric: str,
                   sources: dict[str, dict[str, str | Path]] | None = None
                   ) -> tuple[dict[str, dict[str, float | None]], dict[str, float | None]]:
    """The table's rows ``{row: {column: value}}`` and the average row (mean over the rows with a value).

    A stage's metrics.json without ``metric`` is an error naming the file (``sources``, when given)."""
    rows: dict[str, dict[str, float | None]] = {}
    for target, splits in collections.items():
        for split, by_column in splits.items():
            label = target if len(splits) == 1 else f"{target} ({split})"
            row = {}
            for column in columns:
                values = by_column.get(column)
                if values is not None and metric not in values:
                    where = (sources or {}).get(target, {}).get(column, f"{target}/{column} metrics")
                    raise DataError(where, f"split {split!r} has no {metric!r} (it has {sorted(values)})",
                                    "add the metric to evaluation.metrics and rerun the evaluation, or set "
                                    "transfer.metric to one it has")
                row[column] = None if values is None else float(values[metric])
            rows[label] = row
    average = {}
    for column in columns:
        present = [row[column] for row in rows.values() if row[column] is not None]
        average[column] = sum(present) / len(present) if present else None
    return rows, average


Lengths = dict[str, dict[str, dict[str, int]]]  # {target: {column: {"query": n, "passage": n} or {"pair": n}}}


def used_lengths(declared: dict[str, dict], models: dict[str, str], reranker_max_length: int | None = None
                 ) -> Lengths:
    """The lengths, in tokens, at which each transferred model encoded each target's texts: a bi-encoder (``models``:
    ``{column: its model folder}``) B's queries and passages at B's ``transfer_max_length`` (``declared``:
    ``{target: {"query", "passage"}}``), where None its own max_seq_length (read from the folder as the encoding
    jobs read it, :func:`~dpr_pipeline.models.refs.max_seq_length`); the re-ranker its query-passage pairs at its
    ``max_length`` (``reranker_max_length``, None when it does not transfer)."""
    lengths: Lengths = {}
    for target, wanted in declared.items():
        lengths[target] = {
            column: {side: wanted.get(side) or max_seq_length(folder) for side in ("query", "passage")}
            for column, folder in models.items()}
        if reranker_max_length is not None:
            lengths[target]["reranker"] = {"pair": reranker_max_length}
    return lengths


def render_lengths(lengths: Lengths, labels: dict[str, str]) -> list[str]:
    """The Markdown lines that say the lengths used: a table, one row per collection, ``query / passage`` tokens
    per bi-encoder and the re-ranker's pair length."""
    columns = list(dict.fromkeys(column for by_column in lengths.values() for column in by_column))
    if not columns:
        return []
    lines = ["", "Tokens each model cut the collection's texts at (bi-encoders: query / passage, each collection's "
             "`transfer_max_length`, else the model's own max_seq_length; the re-ranker: the query-passage pair, "
             "its `max_length`):", "", "| collection | " + " | ".join(labels.get(c, c) for c in columns) + " |",
             "| --- |" + " ---: |" * len(columns)]
    for target, by_column in lengths.items():
        cells = [MISSING if c not in by_column else " / ".join(str(v) for v in by_column[c].values())
                 for c in columns]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    return lines


def _cell(value: float | None) -> str:
    return MISSING if value is None else f"{value:.4f}"


def render_transfer_markdown(source: str, metric: str, columns: list[str], rows: dict[str, dict[str, float | None]],
                             average: dict[str, float | None], collections: Collections,
                             labels: dict[str, str], lengths: Lengths | None = None) -> str:
    header = "| collection | " + " | ".join(labels[c] for c in columns) + " |"
    lines = [f"# Zero-shot transfer of {source}'s models ({metric})", "",
             f"BM25 is each collection's own; the other columns are {source}'s models, not trained on the "
             "collection. Average: the mean over the rows.", "", header, "| --- |" + " ---: |" * len(columns)]
    counts = {}
    for target, splits in collections.items():
        for split, by_column in splits.items():
            label = target if len(splits) == 1 else f"{target} ({split})"
            numbers = {values[QUERY_COUNT] for values in by_column.values() if QUERY_COUNT in values}
            counts[label] = f" ({numbers.pop()} queries)" if len(numbers) == 1 else ""
    for label, row in rows.items():
        lines.append(f"| {label}{counts[label]} | " + " | ".join(_cell(row[c]) for c in columns) + " |")
    lines.append(f"| **{AVERAGE}** | " + " | ".join(_cell(average[c]) for c in columns) + " |")
    lines += render_lengths(lengths or {}, labels)
    return "\n".join(lines) + "\n"


def plot_transfer(metric: str, columns: list[str], rows: dict[str, dict[str, float | None]],
                  average: dict[str, float | None], labels: dict[str, str], output: Path) -> None:
    """One group of bars per collection (and the average), one bar per column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = {**rows, AVERAGE: average}
    width = 0.8 / max(1, len(columns))
    fig, ax = plt.subplots(figsize=(2.5 + 1.2 * len(groups) * max(1, len(columns)) * 0.5, 4.2))
    for i, column in enumerate(columns):
        heights = [np.nan if groups[g][column] is None else groups[g][column] for g in groups]
        bars = ax.bar(np.arange(len(groups)) + i * width, heights, width, label=labels[column], color=f"C{i}")
        ax.bar_label(bars, labels=["" if np.isnan(h) else f"{h:.3f}" for h in heights], fontsize=7)
    ax.set_xticks(np.arange(len(groups)) + width * (len(columns) - 1) / 2, list(groups))
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(metric)
    ax.set_title(f"Zero-shot transfer ({metric})")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(output, format="png", dpi=120)
    plt.close(fig)


def write_transfer_summary(source: str, metrics_paths: dict[str, dict[str, str | Path]], metric: str,
                           output_json: str | Path, output_markdown: str | Path, output_png: str | Path,
                           lengths: Lengths | None = None) -> dict:
    """Summarise A's (``source``) transfer: ``metrics_paths`` = ``{target: {column: metrics.json}}``, columns in
    table order (``bm25`` = the target's own BM25 first, then A's stages); ``lengths``: the lengths the models
    encoded each target at (:func:`used_lengths`). Returns the JSON object."""
    if not metrics_paths:
        raise ValueError("no transfer target: datasets.<A>.transfer_to is empty")
    columns = list(dict.fromkeys(column for by_column in metrics_paths.values() for column in by_column))
    labels = {column: STAGE_LABELS.get(column, column) for column in columns}
    collections = collect_transfer(metrics_paths)
    rows, average = transfer_table(collections, columns, metric, metrics_paths)
    summary = {"source": source, "metric": metric, "columns": columns, "rows": rows, "average": average,
               "collections": collections, "lengths": lengths or {}}
    with atomic_outputs(output_json, output_markdown, output_png) as (json_tmp, markdown_tmp, png_tmp):
        json_tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        markdown_tmp.write_text(render_transfer_markdown(source, metric, columns, rows, average, collections,
                                                         labels, lengths), encoding="utf-8")
        plot_transfer(metric, columns, rows, average, labels, png_tmp)
    log.info("transfer of %s to %d collection(s) summarised in %s", source, len(metrics_paths), output_markdown)
    return summary


def check_transfer_leakage(train_queries: str | Path | None, target_queries: dict[str, str | Path],
                           output: str | Path, allow_overlap: bool | list[str] = False) -> dict[str, int]:
    """Zero-shot means B's evaluation queries were never trained on: each of B's evaluation splits
    (``target_queries``: ``{split: queries artifact}``) against A's train queries (``train_queries``; None when A
    has no train split), by identical text (whitespace collapsed; ids mean nothing across collections). A shared
    query is a DataError naming both files, the count and the first query (its row in B's artifact), unless B's
    ``allow_overlap`` is true or lists its id (then a counted warning). Writes ``{split: shared queries}`` to
    ``output`` (JSON) and returns it."""
    shared = {}
    for split, path in target_queries.items():
        if train_queries is None:
            shared[split] = 0
            continue
        queries = read_artifact(path, "queries")
        where = {qid: Location(Path(path), row=row) for row, qid in enumerate(queries["query_id"], start=1)}
        shared[split] = check_overlap(queries, where, train_queries, split, allow_overlap, compare_ids=False)
    with atomic_output(output) as tmp:
        tmp.write_text(json.dumps(shared, indent=2) + "\n", encoding="utf-8")
    log.info("transfer leakage check: %s evaluation queries shared with the train queries %s",
             sum(shared.values()), train_queries)
    return shared
