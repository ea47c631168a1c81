"""Tables for the Snakemake report: Snakemake 9 shows images, HTML and PDF inline (other files only as
downloads), so a report table is a small self-contained HTML page."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.evaluation.summary import QUERY_COUNT, read_metrics

STYLE = ("body{font-family:sans-serif;font-size:14px;margin:1em}table{border-collapse:collapse}"
         "th,td{border:1px solid #ccc;padding:4px 8px}td{text-align:right}th{background:#f2f2f2}"
         "p{color:#444;max-width:60em}")


def write_html_table(frame: pd.DataFrame, output: str | Path, title: str, note: str = "",
                     float_format: str = "{:.4f}") -> None:
    """``frame`` as an HTML page with a heading and an optional note under the table; missing values as –."""
    body = frame.to_html(index=False, na_rep="–", float_format=float_format.format, border=0)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h3>{html.escape(title)}</h3>{body}"
            + (f"<p>{html.escape(note)}</p>" if note else "") + "</body></html>\n")
    with atomic_output(output) as tmp:
        tmp.write_text(page, encoding="utf-8")


def metrics_frame(metrics_json: str | Path) -> pd.DataFrame:
    """A stage's metrics.json as a table: one row per evaluation split, its query count, one column per metric."""
    rows = [{"split": split, "queries": values.get(QUERY_COUNT),
             **{name: value for name, value in values.items() if name != QUERY_COUNT}}
            for split, values in read_metrics(metrics_json).items()]
    return pd.DataFrame(rows)


def write_metrics_table(metrics_json: str | Path, output: str | Path, title: str) -> None:
    write_html_table(metrics_frame(metrics_json), output, title)
