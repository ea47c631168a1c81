"""What a Slurm cluster says about itself, read where the workflow is submitted from: each partition's time limit
and nodes (CPUs, memory, GPUs), the default partition, and the user's accounts (:func:`read_cluster_facts`).

The preflight (:mod:`dpr_pipeline.orchestration.preflight`) checks a plan's jobs against these facts before the first
sbatch. Everything here is parsed from ``sinfo``, ``sacctmgr`` and ``scontrol`` output (the parsers are plain
functions of that text); a command that is missing or fails leaves its fact unknown (None), never guessed.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable

#: ``sinfo`` formats: one line per partition (name with ``*`` for the default, time limit, availability) and one
#: per node and partition (partition, node, CPUs, memory in MB, generic resources).
PARTITION_FORMAT = "%P|%l|%a"
NODE_FORMAT = "%R|%N|%c|%m|%G"


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Partition:
    name: str
    max_minutes: int | None        # None: no limit (INFINITE)
    up: bool = True
    nodes: tuple[Node, ...] = ()

    def most(self, attribute: str) -> int:
        """The largest ``cpus``, ``mem_mb`` or ``gpus`` of one of its nodes (0 without nodes)."""
        return max((getattr(node, attribute) for node in self.nodes), default=0)


@dataclass(frozen=True)
class ClusterFacts:
    partitions: dict[str, Partition]
    default_partition: str | None = None
    accounts: frozenset[str] | None = None       # None: unknown (no sacctmgr)
    max_submit: dict[str, int] = field(default_factory=dict)   # account -> MaxSubmitJobs of the user's association
    accounts_enforced: bool | None = None        # AccountingStorageEnforce holds "associations"
    user: str = field(default_factory=getpass.getuser)


def slurm_minutes(text: str) -> int | None:
    """Minutes of a Slurm time (``sinfo %l``, ``MaxTime``): ``minutes``, ``minutes:seconds``,
    ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``, ``days-hours:minutes:seconds``; None for
    ``infinite``/``UNLIMITED``. Seconds round up (a limit of 90 s allows no 2-minute job)."""
    text = text.strip().lower()
    if text in ("infinite", "unlimited", "n/a"):
        return None
    days, _, clock = text.rpartition("-")
    fields = [int(part) for part in clock.split(":")]
    if days:
        fields += [0] * (3 - len(fields))                         # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = fields
    elif len(fields) == 3:
        hours, minutes, seconds = fields
    elif len(fields) == 2:
        hours, (minutes, seconds) = 0, fields
    else:
        hours, minutes, seconds = 0, fields[0], 0
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)


def gpus_of(gres: str) -> tuple[int, tuple[str, ...]]:
    """The GPU count and types of a node's ``sinfo %G`` (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:2``,
    ``(null)``)."""
    count, models = 0, []
    for entry in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", entry).strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        number = re.match(r"\d+", parts[-1])
        count += int(number.group()) if number else 0
        if len(parts) == 3:
            models.append(parts[1])
    return count, tuple(models)


def parse_partitions(partition_lines: str, node_lines: str) -> tuple[dict[str, Partition], str | None]:
    """Partitions and the default one from ``sinfo -h -o PARTITION_FORMAT`` and ``sinfo -h -N -o NODE_FORMAT``."""
    nodes: dict[str, list[Node]] = {}
    for line in filter(None, map(str.strip, node_lines.splitlines())):
        partition, name, cpus, mem_mb, gres = line.split("|")
        gpus, models = gpus_of(gres)
        nodes.setdefault(partition, []).append(
            Node(name, int(cpus.rstrip("+")), int(mem_mb.rstrip("+")), gpus, models))
    partitions, default = {}, None
    for line in filter(None, map(str.strip, partition_lines.splitlines())):
        name, limit, availability = line.split("|")
        if name.endswith("*"):
            name = default = name[:-1]
        partitions[name] = Partition(name, slurm_minutes(limit), availability == "up", tuple(nodes.get(name, ())))
    return partitions, default


def _output(run: Callable, command: list[str]) -> str | None:
    try:
        done = run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def read_cluster_facts(run: Callable = subprocess.run, user: str | None = None) -> ClusterFacts | None:
    """The facts of the cluster this host submits to; None where ``sinfo`` does not answer (not a Slurm host)."""
    partition_lines = _output(run, ["sinfo", "-h", "-o", PARTITION_FORMAT])
    node_lines = _output(run, ["sinfo", "-h", "-N", "-o", NODE_FORMAT])
    if partition_lines is None or node_lines is None:
        return None
    partitions, default = parse_partitions(partition_lines, node_lines)
    user = user or os.environ.get("USER") or getpass.getuser()
    associations = _output(run, ["sacctmgr", "-nP", "show", "assoc", f"user={user}", "format=account,maxsubmit"])
    rows = [line.strip().split("|") + [""] for line in (associations or "").splitlines() if line.strip()]
    config = _output(run, ["scontrol", "show", "config"])
    enforce = re.search(r"^AccountingStorageEnforce\s*=\s*(.*)$", config or "", re.MULTILINE)
    return ClusterFacts(
        partitions, default,
        accounts=None if associations is None else frozenset(row[0] for row in rows),
        max_submit={row[0]: int(row[1]) for row in rows if row[1].isdigit()},
        accounts_enforced=None if config is None else bool(enforce and "associations" in enforce.group(1)),
        user=user)
