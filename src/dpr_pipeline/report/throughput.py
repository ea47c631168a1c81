"""Throughput of the pipeline's jobs from Snakemake's ``benchmark:`` files and the artifacts' sizes.

Each job is described by a dict: ``task`` (e.g. "corpus encoding"), ``job`` (a label such as
"retriever1 shard 0"), ``benchmark`` (its Snakemake benchmark .tsv: columns ``s``, ``max_rss`` (MB),
``cpu_time``, … one row per repeat), ``unit`` and ``counted`` (the artifact that says how many units the job
processed):

* ``passages``: rows of a Parquet file (the shard's ``embeddings/shard_{k}.ids.parquet``);
* ``queries``: rows of a Parquet file (``data/queries_{split}.parquet``);
* ``query-passage pairs``: the scored (not NaN) positives + negatives of a negatives-schema file (a teacher
  shard);
* ``steps``: the last ``step`` of a training loss log.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.data.schemas import open_parquet
from dpr_pipeline.errors import DataError
from dpr_pipeline.report.plots import read_loss_log
from dpr_pipeline.report.tables import write_html_table

log = logging.getLogger(__name__)

COLUMNS = ["task", "job", "items", "unit", "seconds", "items_per_second", "max_rss_mb", "cpu_seconds"]


def read_benchmark(path: str | Path) -> dict[str, float] | None:
    """Mean wall seconds, max RSS (MB) and CPU seconds of a benchmark file; None when the file does not exist
    (the job ran without it, e.g. copied results)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path, sep="\t")
    except Exception as err:
        raise DataError(path, f"not a Snakemake benchmark table ({err})",
                        "delete it and rerun the job that writes it (snakemake --forcerun <rule>)") from None
    if "s" not in frame.columns or frame.empty:
        raise DataError(path, "no `s` (wall seconds) column or no rows",
                        "delete it and rerun the job that writes it (snakemake --forcerun <rule>)")
    numbers = {column: pd.to_numeric(frame.get(column), errors="coerce") for column in ("s", "max_rss", "cpu_time")}
    return {"seconds": float(numbers["s"].mean()),
            "max_rss_mb": float(numbers["max_rss"].max()) if numbers["max_rss"] is not None else float("nan"),
            "cpu_seconds": float(numbers["cpu_time"].mean()) if numbers["cpu_time"] is not None else float("nan")}


def count_items(path: str | Path, unit: str) -> int:
    """How many ``unit`` the artifact ``path`` holds (see the module docstring)."""
    if unit in ("passages", "queries"):
        return open_parquet(path, f"file of {unit}").metadata.num_rows
    if unit == "query-passage pairs":
        table = open_parquet(path, "negatives file").read(columns=["positive_scores", "negative_scores"])
        return int(sum(pc.sum(pc.invert(pc.is_nan(pc.list_flatten(table[c])))).as_py() or 0
                       for c in table.column_names))
    if unit == "steps":
        return int(read_loss_log(path)[-1]["step"])
    raise ValueError(f"unknown unit {unit!r}")


def throughput_table(jobs: list[dict]) -> pd.DataFrame:
    """One row per job (columns ``COLUMNS``), in the given order; a job without a benchmark file keeps its row
    with missing timings."""
    rows = []
    for job in jobs:
        items = count_items(job["counted"], job["unit"])
        timing = read_benchmark(job["benchmark"])
        if timing is None:
            log.warning("no benchmark file %s: %s %s is listed without timings", job["benchmark"], job["task"],
                        job["job"])
            timing = {"seconds": float("nan"), "max_rss_mb": float("nan"), "cpu_seconds": float("nan")}
        rate = items / timing["seconds"] if timing["seconds"] > 0 else float("nan")
        rows.append({"task": job["task"], "job": job["job"], "items": items, "unit": job["unit"], **timing,
                     "items_per_second": rate})
    return pd.DataFrame(rows, columns=COLUMNS)


def plot_throughput(table: pd.DataFrame, output: str | Path, title: str) -> None:
    """Three horizontal bar charts sharing one row per job: items per second (log scale, unit in the label),
    wall time (s) and peak memory (max RSS, MB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{row.task}: {row.job}" for row in table.itertuples()]
    tasks = list(dict.fromkeys(table["task"]))
    colours = [f"C{tasks.index(task) % 10}" for task in table["task"]]
    y = np.arange(len(table))
    fig, axes = plt.subplots(1, 3, figsize=(13, 1.2 + 0.32 * len(table)), sharey=True,
                             gridspec_kw={"width_ratios": [1.4, 1, 1]})
    panels = [("items_per_second", "items per second (log scale)", "{:.3g} {}/s"),
              ("seconds", "wall time (s)", "{:.1f} s"), ("max_rss_mb", "peak memory, max RSS (MB)", "{:.0f} MB")]
    for ax, (column, xlabel, fmt) in zip(axes, panels):
        values = table[column].to_numpy(dtype=float)
        ax.barh(y, np.nan_to_num(values), color=colours)
        for i, (value, unit) in enumerate(zip(values, table["unit"])):
            text = "not measured" if not np.isfinite(value) else fmt.format(value, unit)
            ax.text(value if np.isfinite(value) else 0, i, " " + text, va="center", fontsize=7)
        if column == "items_per_second" and np.isfinite(values).any() and (values[np.isfinite(values)] > 0).all():
            ax.set_xscale("log")
        finite = values[np.isfinite(values)]
        if len(finite):
            ax.set_xlim(right=finite.max() * (60 if ax.get_xscale() == "log" else 1.45))
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    with atomic_outputs(output) as (tmp,):
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def write_throughput(jobs: list[dict], tsv: str | Path, html: str | Path, png: str | Path, title: str) -> None:
    """The throughput table as TSV (for scripts) and HTML (for the report), and its plot."""
    table = throughput_table(jobs)
    with atomic_outputs(tsv) as (tmp,):
        table.to_csv(tmp, sep="\t", index=False)
    shown = table.rename(columns={"items_per_second": "items/s", "max_rss_mb": "max RSS (MB)",
                                  "seconds": "wall s", "cpu_seconds": "CPU s"})
    write_html_table(shown, html, title, float_format="{:.2f}",
                     note="items/s = items ÷ wall seconds of the job (Snakemake's benchmark `s`, which includes "
                          "loading the model and the data); max RSS is the job's peak resident memory.")
    plot_throughput(table, png, title)
