"""How much a trained stage's metrics move with its seed alone: the spread that a difference must exceed.

For a stage S and seeds n₁ … n_k, each rerun is a Snakemake run of this checkout's workflow in a folder of its own
(``results/{dataset}/seeds/{S}/seed_{n}/``) that holds the finished run's results as hard links (the jobs'
benchmark files as copies: Snakemake rewrites those in place), less S's own outputs and checkpoints, and the
config with S's block's ``seed`` set to n: Snakemake rebuilds S alone (its training, runs and metrics) on the
very inputs the finished run trained S on. The stage's configured seed is the finished run itself. :func:`spread`
then gives, per split and metric, the mean and the sample standard deviation over the seeds, and :func:`margin`
the mean difference of two stages over the seeds both have with its spread.

A row of SimLM's Table 7 ablation (``ablation/<method>``) is rerun whole: its pre-training and its Retriever₁ both
take the seed (:func:`seeded_outputs`), and :func:`write_ablation_report` reads each row against ``none`` and ``mlm``
seed by seed.

A rerun may also change how the negatives the stage trains on are mined (``mining``: settings of
``mining.<fed_by>``, e.g. ``relative_margin``, for Retriever₂ ``mining.retriever1``): its folder is
``seeds/{S}/mining_<key>=<value>…/seed_{n}/``, the mined negatives (and their filter report) are removed too, and
Snakemake remakes them and, through their new time stamp, every stage trained on them before S (for the distilled
retriever: the re-ranker, its teacher). Such a variant has no finished run: its configured seed is rerun as well.
:func:`write_report` then gives the variant's paired difference from the runs without it, seed by seed.

A variant may also change the stage's own settings (``settings``: keys of its config block, e.g. the distilled
retriever's ``negatives_per_query``): its folder is ``seeds/{S}/set_<key>=<value>…/seed_{n}/`` (after the mining
part where both are given), and it is read against the runs without it the same way.

The seed changes what the stage's config ``seed`` drives: batch order, negative draws, weights new to the model
(the re-ranker's head) and dropout. It leaves its inputs (the stage before it, the teacher model) as they are, so
the spread is the stage's own, not the chain's; only the distilled retriever's teacher scores are made again
(:data:`DRAWN_FOR`), since the teacher scores the pairs each seed draws (:mod:`dpr_pipeline.reranking.teacher_scores`).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from dpr_pipeline.layout import TEACHER_SCORES, checkpoint_dir, dataset_dir, negatives_filter_files, stage_file
from dpr_pipeline.stages import ABLATION, CHAIN, PRETRAINING, family_member, member, stage as declared

#: Stages a seed can be varied for (the chain's trained stages), and the config block holding their seed.
SEEDED_STAGES = {stage.name: stage.block for stage in CHAIN if stage.trains}
#: Outputs of another stage made for the seed's own draws (results/<dataset>/<path>), removed with the stage's own
#: so the rerun makes them again: the teacher scores the pairs a student of it (the distilled retriever) draws.
DRAWN_FOR = {stage.name: (f"{stage.teacher}/teacher", *(f"{stage.teacher}/{name}" for name in TEACHER_SCORES.values()))
             for stage in CHAIN if stage.teacher is not None}


def seeded_outputs(stage: str) -> dict[str, str]:
    """The stages a rerun of ``stage`` with another seed makes again, each with the config block that gets the
    seed: a chain stage itself; a member of SimLM's Table 7 ablation (``ablation/<method>``) also its pre-trained
    encoder (``pretrain/<method>``, block ``pretrain``), so the seed is the whole row's: pre-training and
    Retriever₁ (``ablation/none``: Retriever₁ alone)."""
    if stage in SEEDED_STAGES:
        return {stage: SEEDED_STAGES[stage]}
    family, method = family_member(stage) or (None, None)
    if family is not ABLATION:
        raise ValueError(f"stage {stage!r}: a seed spread is for one of {sorted(SEEDED_STAGES)} or "
                         f"{member(ABLATION, '<method>')}")
    pretrained = {} if method == "none" else {member(PRETRAINING, method): PRETRAINING.block}
    return {stage: ABLATION.block, **pretrained}


def variant_name(mining: dict | None, settings: dict | None = None) -> str | None:
    """The folder name of a variant: ``mining_relative_margin=0.05`` for a mining variant,
    ``set_negatives_per_query=15`` for one of the stage's own settings, both joined by ``_``; None for none."""
    parts = [prefix + "_".join(f"{key}={value}" for key, value in sorted(changed.items()))
             for prefix, changed in (("mining_", mining), ("set_", settings)) if changed]
    return "_".join(parts) or None


def seed_workdir(repo: Path, config: dict, dataset: str, stage: str, seed: int,
                 mining: dict | None = None, settings: dict | None = None) -> Path:
    """The folder of one rerun, made (once) as the module docstring says; returns it. ``mining``: settings of
    ``mining.<the stage it trains on the negatives of>`` for this rerun (a variant), none by default;
    ``settings``: keys of the stage's own config block for this rerun (a variant), none by default."""
    remade = seeded_outputs(stage)
    finished = repo / dataset_dir(dataset)
    if not (finished / stage / "metrics.json").is_file():
        raise FileNotFoundError(f"{finished / stage / 'metrics.json'}: run the workflow for {stage} first "
                                f"(snakemake {stage_file(stage, 'metrics.json', dataset)})")
    variant = variant_name(mining, settings)
    mined = declared(stage).fed_by if mining else None   # every trained stage trains on mined negatives
    workdir = finished / "seeds" / stage / (variant or "") / f"seed_{seed}"
    if not (workdir / dataset_dir(dataset)).is_dir():
        copy_of = workdir / dataset_dir(dataset)
        shutil.copytree(finished, copy_of, copy_function=lambda source, target: _link_unless_rewritten(
                            finished, source, target),
                        ignore=lambda folder, names: ["seeds"] if Path(folder) == finished else [])
        for name in remade:
            for own in (copy_of / name, workdir / checkpoint_dir(name, dataset)):
                shutil.rmtree(own, ignore_errors=True)
        for drawn in map(copy_of.joinpath, DRAWN_FOR.get(stage, ())):
            shutil.rmtree(drawn) if drawn.is_dir() else drawn.unlink(missing_ok=True)
        if mined:  # remade from the variant's settings; the stages trained on them follow by time stamp
            remined = (stage_file(mined, "negatives.parquet", dataset),
                       *negatives_filter_files(mined, dataset).values())
            for path in remined:
                (workdir / path).unlink(missing_ok=True)
    seeded = seeded_config(config, dataset, stage, seed, mining, settings)
    (workdir / "config.yaml").write_text(yaml.safe_dump(seeded, sort_keys=False), encoding="utf-8")
    if not (workdir / "data").exists():  # the raw collections, relative to the working directory as in config.yaml
        (workdir / "data").symlink_to((repo / "data").resolve(), target_is_directory=True)
    return workdir


def seeded_config(config: dict, dataset: str, stage: str, seed: int, mining: dict | None = None,
                  settings: dict | None = None) -> dict:
    """``config`` as one rerun of ``stage`` reads it: ``seed`` in the block of each stage it remakes, the variant's
    ``settings`` in the stage's own block and its ``mining`` in ``mining.<the stage it trains on the negatives of>``
    (a copy; ``config`` is left as it is)."""
    remade = seeded_outputs(stage)
    seeded = copy.deepcopy(config)
    stages = seeded["datasets"][dataset].setdefault("stages", {})
    for block in set(remade.values()):
        stages.setdefault(block, {})["seed"] = seed
    if settings:
        stages.setdefault(remade[stage], {}).update(settings)
    if mining:
        stages.setdefault("mining", {}).setdefault(declared(stage).fed_by, {}).update(mining)
    return seeded


def _link_unless_rewritten(finished: Path, source: str, destination: str) -> None:
    """A hard link, but a copy of the jobs' benchmark files (``finished/benchmarks/``): Snakemake rewrites such a file
    in place (the same inode), so a rerun of the job through a link would overwrite the finished run's timing."""
    if Path(source).relative_to(finished).parts[0] == "benchmarks":
        shutil.copy2(source, destination)
    else:
        os.link(source, destination)


def rerun(repo: Path, workdir: Path, dataset: str, stage: str, cores: int) -> Path:
    """Snakemake builds ``stage``'s metrics in ``workdir``; returns that metrics.json. Only what is missing or older
    than its inputs is built (``--rerun-triggers mtime``): the finished run's stages are kept even where the code or
    another stage's settings changed since it ran, so the rerun differs from it in the stage's seed (and variant)
    alone."""
    target = stage_file(stage, "metrics.json", dataset)
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(repo / "Snakefile"), "--directory",
               str(workdir), "--configfile", str(workdir / "config.yaml"), "--cores", str(cores),
               "--rerun-triggers", "mtime", "--", target]
    subprocess.run(command, check=True, cwd=workdir)
    return workdir / target


def _sample_sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def spread(runs: dict[int, dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{split: {metric: {"mean", "sd", "min", "max", "n"}}}`` over the seeds' ``{split: {metric: value}}``
    (``sd``: the sample standard deviation, 0 for one seed)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    first = next(iter(runs.values()), {})
    for split, metrics in first.items():
        for metric in metrics:
            if metric == "num_queries":
                continue
            values = [run[split][metric] for run in runs.values()]
            out.setdefault(split, {})[metric] = {
                "mean": statistics.fmean(values), "sd": _sample_sd(values),
                "min": min(values), "max": max(values), "n": len(values)}
    return out


def _differences(differences: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(differences), "sd": _sample_sd(differences), "min": min(differences),
            "n": len(differences), "all_above": all(d > 0 for d in differences)}


def margin(upper: dict[int, dict], lower: dict[str, dict[str, float]], split: str,
           metric: str) -> dict[str, float]:
    """``upper``'s seeds against one run of the stage below (``lower``): the mean difference, the differences'
    sample sd, and whether every seed is above (``all_above``)."""
    return _differences([run[split][metric] - lower[split][metric] for run in upper.values()])


def paired_margin(upper: dict[int, dict], lower: dict[int, dict], split: str, metric: str) -> dict[str, float]:
    """``upper``'s seeds against ``lower``'s runs of the same seeds (two rows of the ablation: each seed trains
    both the same way but for the start), as :func:`margin` over the seeds both have."""
    common = [seed for seed in upper if seed in lower]
    if not common:
        raise ValueError(f"no seed in common: {sorted(upper)} against {sorted(lower)}")
    return _differences([upper[seed][split][metric] - lower[seed][split][metric] for seed in common])


def render(stage: str, below: str | None, runs: dict[int, dict], summary: dict, margins: dict,
           variant: str | None = None, against_baseline: dict | None = None) -> str:
    """The Markdown report: per split, each metric's mean ± sd over the seeds, the seeds' values, the margin over
    the stage below and, for a variant, its paired difference from the runs without it."""
    seeds = ", ".join(map(str, runs))
    lines = [f"# Seed spread of {stage}{f' ({variant})' if variant else ''} (seeds {seeds})", ""]
    for split, metrics in summary.items():
        lines += [f"## {split}", "", "| metric | mean ± sd | min | max | " + " | ".join(f"seed {s}" for s in runs)
                  + " |", "| --- | ---: | ---: | ---: |" + " ---: |" * len(runs)]
        for metric, s in metrics.items():
            values = " | ".join(f"{run[split][metric]:.4f}" for run in runs.values())
            lines.append(f"| {metric} | {s['mean']:.4f} ± {s['sd']:.4f} | {s['min']:.4f} | {s['max']:.4f} | "
                         f"{values} |")
        if below is not None and split in margins:
            lines.append("")
            for metric, m in margins[split].items():
                verdict = ("above on every seed" if m["all_above"] else "not above on every seed")
                lines.append(f"- {metric} − {below}: {m['mean']:+.4f} ± {m['sd']:.4f} (min {m['min']:+.4f}, "
                             f"{m['n']} seeds; {verdict})")
        for metric, m in (against_baseline or {}).get(split, {}).items():
            verdict = "above on every seed" if m["all_above"] else "not above on every seed"
            lines.append(f"- {metric} − without {variant} (paired by seed): {m['mean']:+.4f} ± {m['sd']:.4f} "
                         f"(min {m['min']:+.4f}, {m['n']} seeds; {verdict})")
        lines.append("")
    return "\n".join(lines)


def _write(output_stem: Path, report: dict, markdown: str) -> dict:
    """``<output_stem>.json`` (``report``) and ``<output_stem>.md`` (``markdown``); returns ``report``."""
    output_stem.parent.mkdir(parents=True, exist_ok=True)
    named = output_stem.name   # may hold dots (mining_relative_margin=0.05): not a suffix
    output_stem.with_name(f"{named}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    output_stem.with_name(f"{named}.md").write_text(markdown, encoding="utf-8")
    return report


def write_report(output_stem: Path, stage: str, below: str | None, runs: dict[int, dict],
                 lower: dict | None, variant: str | None = None, baseline: dict[int, dict] | None = None) -> dict:
    """``<output_stem>.json`` and ``.md`` for ``stage``'s seeds, with margins over ``below``'s metrics and, for a
    ``variant``, the paired difference from ``baseline`` (the stage's runs without it, by seed) where given."""
    summary = spread(runs)
    margins, against_baseline = {}, {}
    for split, metrics in summary.items():
        if lower is not None and split in lower:
            margins[split] = {m: margin(runs, lower, split, m) for m in metrics if m in lower[split]}
        if baseline:
            against_baseline[split] = {m: paired_margin(runs, baseline, split, m) for m in metrics}
    report = {"stage": stage, "below": below, "variant": variant, "seeds": {str(s): r for s, r in runs.items()},
              "spread": summary, "margin_over_below": margins, "paired_difference_without_variant": against_baseline}
    return _write(output_stem, report, render(stage, below, runs, summary, margins, variant, against_baseline))



#: The ablation rows every other row is read against, seed by seed: the plm as is, and the plain masked LM.
ABLATION_BASELINES = ("none", "mlm")


def write_ablation_report(output_stem: Path, runs: dict[str, dict[int, dict]], metric: str = "nDCG@10") -> dict:
    """``<output_stem>.json`` and ``.md``: SimLM's Table 7 over seeds. ``runs``: ``{method: {seed: metrics}}``.
    Per split, each method's mean ± sd of every metric and, where the baseline ran the same seeds, its paired
    difference from each of :data:`ABLATION_BASELINES` (:func:`paired_margin`); the Markdown shows ``metric``."""
    summary = {method: spread(seeds) for method, seeds in runs.items()}
    against = {}
    for method, seeds in runs.items():
        for baseline in ABLATION_BASELINES:
            if baseline == method or baseline not in runs or not set(seeds) & set(runs[baseline]):
                continue
            against.setdefault(method, {})[baseline] = {
                split: {m: paired_margin(seeds, runs[baseline], split, m) for m in metrics}
                for split, metrics in summary[method].items()}
    report = {"seeds": {method: {str(s): r for s, r in seeds.items()} for method, seeds in runs.items()},
              "spread": summary, "paired_difference": against}
    splits = list(next(iter(summary.values())))
    lines = [f"# Pre-training ablation over seeds: Retriever₁ fine-tuned from each method ({metric})", "",
             "Each seed trains the whole row (pre-training and Retriever₁); a difference is taken seed by seed "
             "against the baseline's run of the same seed (mean ± sd over the seeds both have; ✓: above on "
             "every one).", ""]
    for split in splits:
        lines += [f"## {split}", "", "| method | mean ± sd | seeds | "
                  + " | ".join(f"− {b}" for b in ABLATION_BASELINES) + " |",
                  "| --- | ---: | --- |" + " ---: |" * len(ABLATION_BASELINES)]
        for method, seeds in runs.items():
            s = summary[method][split][metric]
            values = ", ".join(f"{seed}: {run[split][metric]:.4f}" for seed, run in seeds.items())
            cells = []
            for baseline in ABLATION_BASELINES:
                m = against.get(method, {}).get(baseline, {}).get(split, {}).get(metric)
                cells.append("–" if m is None else
                             f"{m['mean']:+.4f} ± {m['sd']:.4f}{' ✓' if m['all_above'] else ''}")
            lines.append(f"| {method} | {s['mean']:.4f} ± {s['sd']:.4f} | {values} | " + " | ".join(cells) + " |")
        lines.append("")
    return _write(output_stem, report, "\n".join(lines))
