"""The scale rehearsal's library, beside ``scripts/rehearsal.py`` which imports it (docs/cluster.md, "Scale rehearsal"):
the msmarco chain through ``--profile slurm`` on synthetic MS MARCO at a fraction (``synthetic_msmarco``), every
job's peak memory (``job_memory``) and wall time, and the extrapolation to the full collection that is compared
with the msmarco entry's requests.

``scripts/rehearsal.py`` runs one fraction and writes ``benchmarks/rehearsal/f<fraction>/jobs.csv`` (one row per
Slurm job: :data:`JOB_COLUMNS`) and ``summary.md``; :func:`extrapolate` reads two such runs or more.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from dpr_pipeline.errors import DataError
from dpr_pipeline.orchestration.config import stage_params, validate_config
from dpr_pipeline.orchestration.resources import job_resources
from dpr_pipeline.orchestration.stage_settings import training_processes
from dpr_pipeline.stages import GPU_TRAINING_RULES, SHARD_GROUPS
from synthetic_msmarco import FULL

#: Columns of a run's jobs.csv.
JOB_COLUMNS = ["rule", "wildcards", "slurm_job", "state", "wall_s", "peak_mb", "sum_rss_mb", "process_hwm_mb",
               "processes", "sacct_maxrss_mb"]
#: The embedding width of the rehearsal's BERT (:func:`save_tiny_bert`) and of BERT-base, the msmarco entry's.
REHEARSAL_WIDTH, FULL_WIDTH = 64, 768
#: Bytes per passage and embedding dimension that a job holds for the vectors it encodes, indexes or searches:
#: a shard's float16 vectors (encode_corpus); the float16 shards read (memory-mapped) and the float32 flat index
#: built from them (build_index); the float32 index searched (dense_search). The rehearsal's narrower vectors
#: leave (FULL_WIDTH - REHEARSAL_WIDTH) of these per passage out of its measurements: :func:`vector_correction_mb`.
VECTOR_BYTES = {"encode_corpus": 2, "build_index": 2 + 4, "dense_search": 4}
#: The share of a job's memory request that its extrapolated need may reach (docs/cluster.md).
HEADROOM = 0.8


def save_tiny_bert(path: str | Path, tokenizer, hidden: int = REHEARSAL_WIDTH, layers: int = 2, seed: int = 0) -> Path:
    """A randomly initialised BERT (masked-LM head included, as bert-base-uncased is published) of ``layers``
    layers and width ``hidden``, with ``tokenizer``'s vocabulary, saved as a model folder a ``plm`` can name."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=4 * hidden, max_position_embeddings=512)
    torch.manual_seed(seed)
    BertForMaskedLM(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return Path(path)


def slurm_jobs(logdir: str | Path) -> dict[str, tuple[str, str]]:
    """``{Slurm job id: (rule, wildcards)}`` from the slurm profile's logs, ``<logdir>/rule_<rule>/<wildcards>/
    <job id>.log`` (wildcards as the plugin writes them, e.g. ``msmarco_3``; empty for none), and a shard rule's
    group jobs (:data:`dpr_pipeline.stages.SHARD_GROUPS`), ``<logdir>/group_<group id>_<rule>/<job id>.log``, as
    that rule's with their group id for wildcards."""
    jobs = {}
    for log in Path(logdir).glob("rule_*/**/*.log"):
        parts = log.relative_to(logdir).parts
        rule = parts[0][len("rule_"):]
        jobs[log.stem] = (rule, "/".join(parts[1:-1]))
    for log in Path(logdir).glob("group_*/**/*.log"):
        name = log.relative_to(logdir).parts[0][len("group_"):]
        rule = next((rule for rule in sorted(SHARD_GROUPS, key=len, reverse=True) if name.endswith(f"_{rule}")), None)
        if rule is not None:
            jobs[log.stem] = (rule, name[:-len(rule) - 1])
    return jobs


def parse_sacct(text: str) -> dict[str, dict]:
    """``sacct -P -n -o JobID,State,ElapsedRaw,MaxRSS`` (allocations and their steps): per job id its state and
    wall seconds (the allocation's line) and the largest MaxRSS of its steps (MB; Slurm's own 30 s samples)."""
    jobs: dict[str, dict] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_step, state, elapsed, maxrss = line.split("|")
        job, _, step = job_step.partition(".")
        row = jobs.setdefault(job, {"state": "", "wall_s": 0, "sacct_maxrss_mb": 0.0})
        if not step:
            row.update(state=state.split()[0], wall_s=int(elapsed or 0))
        if maxrss:
            number, unit = re.fullmatch(r"([\d.]+)([KMGT]?)", maxrss).groups()
            mb = float(number) * {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 2**20}[unit]
            row["sacct_maxrss_mb"] = max(row["sacct_maxrss_mb"], mb)
    return jobs


def sacct(job_ids) -> dict[str, dict]:
    """:func:`parse_sacct` of Slurm's accounting for ``job_ids``."""
    ids = ",".join(sorted(job_ids)) or "0"
    done = subprocess.run(["sacct", "-P", "-n", "-o", "JobID,State,ElapsedRaw,MaxRSS", "-j", ids],
                          capture_output=True, text=True, check=True)
    return parse_sacct(done.stdout)


def job_table(jobs: dict[str, tuple[str, str]], accounting: dict[str, dict], peaks: dict) -> pd.DataFrame:
    """One row per Slurm job (:data:`JOB_COLUMNS`): its rule and wildcards, Slurm's state, wall time and MaxRSS,
    and the monitor's peak (``peaks``: job id -> :class:`job_memory.JobPeak`)."""
    rows = []
    for job, (rule, wildcards) in jobs.items():
        peak, account = peaks.get(job), accounting.get(job, {})
        rows.append({"rule": rule, "wildcards": wildcards, "slurm_job": int(job),
                     "state": account.get("state", "UNKNOWN"), "wall_s": account.get("wall_s", 0),
                     "peak_mb": round(peak.peak_mb, 1) if peak else 0.0,
                     "sum_rss_mb": round(peak.sum_rss_mb, 1) if peak else 0.0,
                     "process_hwm_mb": round(peak.process_hwm_mb, 1) if peak else 0.0,
                     "processes": len(peak.processes) if peak else 0,
                     "sacct_maxrss_mb": round(account.get("sacct_maxrss_mb", 0.0), 1)})
    return pd.DataFrame(rows, columns=JOB_COLUMNS).sort_values("slurm_job", ignore_index=True)


def rule_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: its jobs, the largest peak and wall time of one job (a request is per job), the summed wall time."""
    grouped = jobs.groupby("rule")
    return pd.DataFrame({"jobs": grouped.size(), "peak_mb": grouped["peak_mb"].max(),
                         "wall_s": grouped["wall_s"].max(), "total_wall_s": grouped["wall_s"].sum()})


def vector_correction_mb(passages: int, encode_shards: int) -> dict[str, float]:
    """Per rule of :data:`VECTOR_BYTES`: the MB its full-scale job holds beyond the rehearsal's for BERT-base's
    wider vectors (``passages`` in the collection, an encoding job holding ``1 / encode_shards`` of them)."""
    held = {"encode_corpus": passages / encode_shards, "build_index": passages, "dense_search": passages}
    return {rule: held[rule] * (FULL_WIDTH - REHEARSAL_WIDTH) * size / 2**20 for rule, size in VECTOR_BYTES.items()}


def line(points: dict[float, float]) -> tuple[float, float]:
    """The least-squares line a + b·F through ``points`` ({fraction: value}, two or more): ``(a, b)``."""
    fractions = np.array(sorted(points), dtype=float)
    values = np.array([points[f] for f in sorted(points)], dtype=float)
    slope, intercept = np.polyfit(fractions, values, 1)
    return float(intercept), float(slope)


def at_full_scale(points: dict[float, float]) -> float:
    """:func:`line` through ``points`` read at F = 1, never below a measurement (a drop between fractions is
    noise, not a shrinking need)."""
    intercept, slope = line(points)
    return max(intercept + slope, *points.values())


def held_out_error(points: dict[float, float]) -> float | None:
    """With three fractions or more: the line through all but the largest, read at the largest, relative to what
    was measured there (``-0.1``: 10 % under); None with two. How well the line extrapolates ``max / second``-fold."""
    if len(points) < 3:
        return None
    largest = max(points)
    intercept, slope = line({f: v for f, v in points.items() if f != largest})
    return (intercept + slope * largest) / points[largest] - 1


def extrapolate(runs: dict[float, pd.DataFrame], requests: dict[str, dict], processes: dict[str, int],
                extra_mb: dict[str, float]) -> pd.DataFrame:
    """Per rule measured at two fractions or more (``runs``: {fraction: jobs.csv}): the largest job's peak memory
    and wall time at each fraction, the memory's growth from the smallest to the largest, :func:`at_full_scale`
    and :func:`held_out_error` of both; the memory plus what the rehearsal leaves out (``extra_mb``:
    :func:`vector_correction_mb`), times the rule's training processes at full scale (``processes``; the rehearsal
    trains in one), against the rule's first-attempt request (``requests``: rule -> ``mem_mb``, ``runtime`` in
    minutes) and the memory's share of it."""
    tables = {fraction: rule_table(jobs) for fraction, jobs in sorted(runs.items())}
    rows = []
    for rule in sorted({rule for table in tables.values() for rule in table.index}):
        measured = {fraction: table.loc[rule] for fraction, table in tables.items() if rule in table.index}
        if len(measured) < 2:
            continue
        peaks = {fraction: float(row["peak_mb"]) for fraction, row in measured.items()}
        walls = {fraction: float(row["wall_s"]) for fraction, row in measured.items()}
        need = (at_full_scale(peaks) + extra_mb.get(rule, 0.0)) * processes.get(rule, 1)
        error = held_out_error(peaks)
        rows.append({"rule": rule, "jobs": int(measured[max(measured)]["jobs"]),
                     **{f"peak_mb_at_{fraction:g}": peak for fraction, peak in peaks.items()},
                     "growth": round(peaks[max(peaks)] / peaks[min(peaks)], 2),
                     "held_out_error": None if error is None else round(error, 3),
                     "vectors_mb": round(extra_mb.get(rule, 0.0)), "processes": processes.get(rule, 1),
                     "extrapolated_mb": round(need), "requested_mb": requests[rule]["mem_mb"],
                     "share_of_request": round(need / requests[rule]["mem_mb"], 3),
                     **{f"wall_s_at_{fraction:g}": wall for fraction, wall in walls.items()},
                     "extrapolated_wall_min": round(at_full_scale(walls) / 60, 1),
                     "requested_runtime_min": requests[rule]["runtime"]})
    return pd.DataFrame(rows).set_index("rule")


def committed_runs(measured: str | Path) -> dict[float, pd.DataFrame]:
    """Every fraction's jobs.csv under ``measured`` (``f<fraction>/jobs.csv``); a DataError when fewer than two
    fractions were measured."""
    runs = {float(folder.name[1:]): pd.read_csv(folder / "jobs.csv") for folder in Path(measured).glob("f*")
            if (folder / "jobs.csv").is_file()}
    if len(runs) < 2:
        raise DataError(Path(measured), f"{len(runs)} measured fraction(s), the extrapolation needs two",
                        "run scripts/rehearsal.py --fraction F at fractions 10x and 30x apart")
    return dict(sorted(runs.items()))


def msmarco_extrapolation(measured: str | Path, config_file: str | Path, schema_file: str | Path) -> pd.DataFrame:
    """:func:`extrapolate` of the runs under ``measured`` against the ``msmarco`` entry of ``config_file`` (its
    ``resources`` and its trainings' ``processes``)."""
    config = yaml.safe_load(Path(config_file).read_text())
    validate_config(config, schema_file)
    runs = committed_runs(measured)
    rules = {rule for run in runs.values() for rule in run["rule"]}
    requests = {rule: job_resources(config, "msmarco", rule) for rule in rules}
    processes = {rule: training_processes(config, "msmarco", block) for rule, block in GPU_TRAINING_RULES.items()}
    vectors = vector_correction_mb(FULL["passages"], stage_params(config, "msmarco", "retriever")["encode_shards"])
    return extrapolate(runs, requests, processes, vectors)


def markdown_table(table: pd.DataFrame) -> str:
    """:func:`extrapolate`'s table as docs/cluster.md shows it (memory in GB, wall time in s and min)."""
    fractions = [c.split("_at_")[1] for c in table.columns if c.startswith("peak_mb_at_")]

    def at_each(row, what: str, scale: float, digits: int) -> str:
        return " / ".join("–" if pd.isna(row[f"{what}_at_{f}"]) else f"{row[f'{what}_at_{f}'] / scale:.{digits}f}"
                          for f in fractions)

    lines = [f"| rule (largest job) | jobs | peak at {' / '.join(fractions)} | growth | held-out error | "
             f"extrapolated to 1 (+ BERT-base's vectors, × processes) | requested | share | wall at "
             f"{' / '.join(fractions)} | extrapolated wall | requested runtime |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for rule, row in table.iterrows():
        processes = f" (× {row['processes']:.0f})" if row["processes"] > 1 else ""
        processes += f" (+ {row['vectors_mb'] / 1024:.1f} GB vectors)" if row["vectors_mb"] else ""
        error = "–" if pd.isna(row["held_out_error"]) else f"{row['held_out_error']:+.0%}"
        lines.append(f"| `{rule}` | {row['jobs']:.0f} | {at_each(row, 'peak_mb', 1024, 2)} GB | "
                     f"{row['growth']:.2f}× | {error} | {row['extrapolated_mb'] / 1024:.1f} GB{processes} | "
                     f"{row['requested_mb'] / 1000:g} GB | "
                     f"{row['share_of_request']:.0%} | {at_each(row, 'wall_s', 1, 0)} s | "
                     f"{row['extrapolated_wall_min']:g} min | {row['requested_runtime_min']:.0f} min |")
    return "\n".join(lines)
