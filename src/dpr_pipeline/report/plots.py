"""Plots for the Snakemake report."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.data.text_files import iter_json_lines
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.summary import read_metrics
from dpr_pipeline import stages


def plot_stage_metrics(metrics_json: str | Path, output: str | Path, title: str) -> None:
    """A grouped bar chart of a stage's metrics.json: one group per metric, one bar per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (name, path) in enumerate(loss_logs.items()):
        rows = read_loss_log(path)
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


def score_panels(mined: dict[str, str | Path], teacher_scores: str | Path) -> dict[str, tuple[str | Path, str]]:
    """The score distributions' panels, ``{title: (negatives file, what its scores are)}``: each mined stage's
    negatives (``mined``: stage -> its negatives.parquet, in pipeline order), with the stages they train
    (:mod:`dpr_pipeline.stages`), then the teacher's scores of the negatives its student distils."""
    panels = {}
    for name, path in mined.items():
        declared = stages.stage(name)
        trains = " and ".join(stages.prose(fed) for fed in stages.fed_by(name))
        if declared.kind == stages.LEXICAL:
            panels[f"{declared.label} negatives (they train {trains})"] = (path, f"{declared.label} score")
        else:
            panels[f"{declared.label}'s mined negatives (they train {trains})"] = (
                path, f"{declared.label} cosine similarity")
    scored = stages.stage(stages.stage(stages.teacher()).fed_by).label
    panels[f"Teacher scores of the same {scored} negatives (distillation targets)"] = (
        teacher_scores, "teacher θ (re-ranker logit)")
    return panels


def read_loss_log(path: str | Path) -> list[dict]:
    """The rows of a training stage's loss_log.jsonl (``step``, ``loss``, ``learning_rate``, …); at least one."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "the loss log does not exist", "run the stage's training rule")
    rows = [row for _, row in iter_json_lines(path, ("step", "loss"))]
    if not rows:
        raise DataError(path, "the loss log is empty", "delete the stage's model folder and rerun its training rule")
    return rows


def plot_training_loss(loss_log: str | Path, output: str | Path, title: str) -> None:
    """One training stage's loss against step: raw losses faintly, a running mean over 10 % of the steps (its
    first and last values in the legend), and the learning-rate schedule on a second axis (grey, dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    rows = read_loss_log(loss_log)
    steps = np.array([r["step"] for r in rows])
    losses = np.array([r["loss"] for r in rows], dtype=float)
    window = max(1, len(losses) // 10)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    if window > 1:
        ax.plot(steps, losses, color="C0", alpha=0.3, linewidth=0.8, label="loss of each step")
        ax.plot(steps[window - 1:], smooth, color="C0", linewidth=2,
                label=f"running mean over {window} steps ({smooth[0]:.3f} → {smooth[-1]:.3f})")
    else:  # under 20 steps: nothing to smooth
        ax.plot(steps, losses, color="C0", linewidth=2, marker="o", markersize=3,
                label=f"loss of each step ({losses[0]:.3f} → {losses[-1]:.3f})")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if all("learning_rate" in r for r in rows):
        lr_axis = ax.twinx()
        lr_axis.plot(steps, [r["learning_rate"] for r in rows], color="0.45", linestyle="--", linewidth=1)
        lr_axis.set_ylabel("learning rate (dashed)", color="0.45")
        lr_axis.tick_params(axis="y", colors="0.45")
        lr_axis.set_ylim(bottom=0)
        lr_axis.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:.1e}"))
        handles.append(lr_axis.lines[0])
        labels.append("learning rate (right axis)")
    ax.legend(handles, labels, fontsize=8, loc="best")
    if "seconds" in rows[-1]:
        ax.text(0.01, 0.02, f"{len(rows)} steps logged, {rows[-1]['seconds']:.0f} s of training",
                transform=ax.transAxes, fontsize=8, color="0.3")
    fig.tight_layout()
    with atomic_output(output) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def score_separation(frame) -> dict:
    """Scores of a negatives-schema frame: finite positive and negative scores, how many positives have no score
    (not retrieved by the source ranker, or a pair the teacher was not asked to score), and the share of queries whose
    best positive outscores all its
    negatives (among queries with a scored positive and at least one scored negative)."""
    positives = [np.asarray(s, dtype=float) for s in frame["positive_scores"]]
    negatives = [np.asarray(s, dtype=float) for s in frame["negative_scores"]]
    all_positives = np.concatenate(positives) if positives else np.zeros(0)
    all_negatives = np.concatenate(negatives) if negatives else np.zeros(0)
    compared = above = 0
    for pos, neg in zip(positives, negatives):
        pos, neg = pos[np.isfinite(pos)], neg[np.isfinite(neg)]
        if len(pos) and len(neg):
            compared += 1
            above += bool(pos.max() > neg.max())
    return {"positives": all_positives[np.isfinite(all_positives)],
            "negatives": all_negatives[np.isfinite(all_negatives)],
            "unscored_positives": int((~np.isfinite(all_positives)).sum()),
            "unscored_negatives": int((~np.isfinite(all_negatives)).sum()),
            "queries": len(frame), "compared_queries": compared,
            "positive_first": above / compared if compared else float("nan")}


def plot_score_distributions(sources: dict[str, str | Path], output: str | Path, title: str,
                             score_names: dict[str, str] | None = None) -> None:
    """One panel per negatives-schema artifact (panel title -> path): histograms, each normalised to density,
    of the source ranker's scores of the queries' positives and of their (sampled) negatives; ``score_names``
    (panel title -> x-axis label) says what the scores are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(sources), 1, figsize=(7.5, 2.7 * len(sources)), squeeze=False)
    for ax, (name, path) in zip(axes[:, 0], sources.items()):
        scores = score_separation(read_artifact(path, "negatives"))
        pos, neg = scores["positives"], scores["negatives"]
        ax.set_title(name, fontsize=10, loc="left")
        if not len(pos) and not len(neg):
            ax.text(0.5, 0.5, "no scores in this artifact (e.g. official negatives)", ha="center",
                    transform=ax.transAxes)
            ax.set_yticks([])
            continue
        both = np.concatenate([pos, neg])
        bins = np.linspace(both.min(), both.max(), 41) if both.max() > both.min() else 10
        missing = f", {scores['unscored_positives']} without a score" if scores["unscored_positives"] else ""
        ax.hist(neg, bins=bins, density=True, alpha=0.55, color="C3", label=f"negatives ({len(neg)} scores)")
        if len(pos):
            ax.hist(pos, bins=bins, density=True, alpha=0.55, color="C2",
                    label=f"positives ({len(pos)} scores{missing})")
        ax.set_ylabel("density")
        ax.set_xlabel((score_names or {}).get(name, "score"), fontsize=8, labelpad=1)
        separation = (f"best positive above every negative:\n{100 * scores['positive_first']:.1f} % of "
                      f"{scores['compared_queries']} queries" if scores["compared_queries"] else None)
        legend = ax.legend(fontsize=8, loc="best", title=separation, title_fontsize=8)
        legend._legend_box.align = "left"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    with atomic_output(output) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
