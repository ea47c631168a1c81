"""Wall time per pipeline stage of a finished run, from the jobs' Snakemake benchmark files (the table in docs/results/scifact.md).

    .venv/bin/python experiments/stage_wall_times.py results/scifact

Each job's `s` (wall seconds) is summed into the stage the job serves: data and BM25 (ingestion, index, searches,
negatives), the starting model, Retriever₁, Retriever₂ (training, encoding, index, searches, mining, evaluation),
the re-ranker (training, re-ranking, the fused runs, teacher scores) and the distilled retriever; the report's
plots last. Jobs run one after another on a 2-core machine, so the sum is close to the run's wall time.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

STAGES = [  # (label, pattern on the benchmark file name), first match wins
    ("data + BM25", r"(^ingest|bm25)"),
    ("starting model (save, encode, search, evaluate)", r"(^starting_model|_start(_|\.|$))"),
    ("Retriever₁ (train, encode, search, mine, evaluate)", r"retriever1"),
    ("Retriever₂ (train, encode, search, mine, evaluate)", r"retriever2"),
    ("re-ranker (train, re-rank dev and test, fuse, teacher scores)", r"(reranker|^rerank|teacher|fus)"),
    ("distilled retriever (train, encode, search, evaluate)", r"distill"),
    ("summary and report plots", r"."),
]


def stage_of(benchmark: str) -> str:
    return next(label for label, pattern in STAGES if re.search(pattern, benchmark))


def wall_times(results: Path) -> pd.Series:
    rows = {path.stem: float(pd.read_csv(path, sep="\t")["s"].iloc[0])
            for path in sorted((results / "benchmarks").glob("*.tsv"))}
    if not rows:
        raise SystemExit(f"no benchmark files in {results / 'benchmarks'}: run the workflow first")
    seconds = pd.Series(rows).groupby(stage_of).sum()
    return seconds.reindex([label for label, _ in STAGES]).dropna()


def main() -> None:
    seconds = wall_times(Path(sys.argv[1] if len(sys.argv) > 1 else "results/scifact"))
    print("| stage | wall time |\n| --- | ---: |")
    for label, value in seconds.items():
        print(f"| {label} | {int(value // 60)} min {int(value % 60):02d} s |")
    print(f"| **all jobs** | **{int(seconds.sum() // 60)} min {int(seconds.sum() % 60):02d} s** |")


if __name__ == "__main__":
    main()
