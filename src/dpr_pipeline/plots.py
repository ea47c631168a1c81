"""Plots for the Snakemake report."""

from __future__ import annotations

import json
from pathlib import Path

from .io import atomic_output


def plot_stage_metrics(metrics_json: str | Path, output: str | Path, title: str) -> None:
    """A grouped bar chart of a stage's metrics.json: one group per metric, one bar per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    per_split = json.loads(Path(metrics_json).read_text())
    splits = list(per_split)
    names = [k for k in next(iter(per_split.values())) if k != "num_queries"]
    width = 0.8 / max(1, len(splits))
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(names), 3.6))
    for i, split in enumerate(splits):
        values = [per_split[split][n] for n in names]
        bars = ax.bar(np.arange(len(names)) + i * width, values, width,
                      label=f"{split} ({per_split[split]['num_queries']} queries)")
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
    ax.set_xticks(np.arange(len(names)) + width * (len(splits) - 1) / 2, names)
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with atomic_output(output) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
