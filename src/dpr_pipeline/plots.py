"""Plots for the Snakemake report."""

from __future__ import annotations

import json
from pathlib import Path

from .io import atomic_output
from .summary import read_metrics


def plot_stage_metrics(metrics_json: str | Path, output: str | Path, title: str) -> None:
    """A grouped bar chart of a stage's metrics.json: one group per metric, one bar per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    per_split = read_metrics(metrics_json)
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


def plot_loss_curves(loss_logs: dict[str, str | Path], output: str | Path, title: str) -> None:
    """Training loss against step for several runs (name -> loss_log.jsonl), each smoothed by a running mean
    over 5 % of its steps; the raw points are drawn faintly behind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (name, path) in enumerate(loss_logs.items()):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        steps = np.array([r["step"] for r in rows])
        losses = np.array([r["loss"] for r in rows])
        window = max(1, len(losses) // 20)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps, losses, color=f"C{i}", alpha=0.2, linewidth=0.8)
        ax.plot(steps[window - 1:], smooth, color=f"C{i}", label=f"{name} ({losses[0]:.2f} → {smooth[-1]:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(output) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
