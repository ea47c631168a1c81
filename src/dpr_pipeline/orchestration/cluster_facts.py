"""What a Slurm cluster says about itself, read where the workflow is submitted from: each partition's time limit
and nodes (CPUs, memory, GPUs and their types), the default partition, the user's associations (accounts, their
QoS and submit limits) and the limits of each QoS (:func:`read_cluster_facts`).

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
NODE_FORMAT = "%R|%N|%c|%m|%G|%t"
#: ``sinfo %t`` states of a node that takes jobs (a state ending in ``*`` does not respond: it takes none).
TAKES_JOBS = frozenset({"idle", "mix", "mixed", "alloc", "allocated", "comp", "completing", "plnd", "planned"})
#: ``sacctmgr -nP show`` formats: one line per association of the user (account, MaxSubmitJobs, default QoS, the
#: QoS it may use) and one per QoS (name, MaxSubmitJobsPerUser, MaxWall, MaxTRESPerUser, MaxTRES per job).
ASSOCIATION_FORMAT = "account,maxsubmit,defaultqos,qos"
QOS_FORMAT = "name,maxsubmitjobsperuser,maxwall,maxtresperuser,maxtres"


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
    nodes: tuple[Node, ...] = ()           # those that take jobs (sinfo %t)
    offline: tuple[str, ...] = ()          # the others: "name (state)", down, drained, not responding ...

    def most(self, attribute: str) -> int:
        """The largest ``cpus``, ``mem_mb`` or ``gpus`` of one of its nodes (0 without nodes)."""
        return max((getattr(node, attribute) for node in self.nodes), default=0)


@dataclass(frozen=True)
class Association:
    """One of the user's associations (``sacctmgr show assoc``)."""
    account: str
    max_submit: int | None = None                # MaxSubmitJobs; None: no limit
    default_qos: str | None = None               # DefaultQOS; None: not set
    qos: tuple[str, ...] = ()                    # the QoS its jobs may ask for

    def job_qos(self) -> str | None:
        """The QoS of a job that asks none: the default QoS, else the only one it may use; None where Slurm would
        take the root association's default or ``normal`` (not in this association's answer)."""
        return self.default_qos or (self.qos[0] if len(self.qos) == 1 else None)


@dataclass(frozen=True)
class Qos:
    """A QoS's limits (``sacctmgr show qos``); None or absent: no limit."""
    name: str
    max_submit_per_user: int | None = None       # MaxSubmitPU: jobs pending or running
    max_wall: int | None = None                  # MaxWall, minutes
    max_tres_per_user: dict[str, int] = field(default_factory=dict)    # MaxTRESPU, e.g. {"gres/gpu": 4}
    max_tres_per_job: dict[str, int] = field(default_factory=dict)     # MaxTRES


@dataclass(frozen=True)
class ClusterFacts:
    partitions: dict[str, Partition]
    default_partition: str | None = None
    associations: tuple[Association, ...] | None = None    # None: unknown (no sacctmgr)
    qos: dict[str, Qos] | None = None            # name -> limits; None: unknown
    accounts_enforced: bool | None = None        # AccountingStorageEnforce holds "associations"
    user: str = field(default_factory=getpass.getuser)

    @property
    def accounts(self) -> frozenset[str] | None:
        """The user's accounts; None: unknown."""
        return None if self.associations is None else frozenset(a.account for a in self.associations)


def slurm_minutes(text: str) -> int | None:
    """Minutes of a Slurm time (``sinfo %l``, ``MaxTime``, ``sacctmgr``'s ``MaxWall``): ``minutes``,
    ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
    ``days-hours:minutes:seconds``; None for ``infinite``/``UNLIMITED`` and for sacctmgr's empty field (no limit).
    Seconds round up (a limit of 90 s allows no 2-minute job)."""
    text = text.strip().lower()
    if text in ("", "infinite", "unlimited", "n/a"):
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
    offline: dict[str, list[str]] = {}
    for line in filter(None, map(str.strip, node_lines.splitlines())):
        partition, name, cpus, mem_mb, gres, state = (line.split("|") + ["idle"])[:6]   # no %t: as if idle
        if not takes_jobs(state):
            offline.setdefault(partition, []).append(f"{name} ({state})")
            continue
        gpus, models = gpus_of(gres)
        nodes.setdefault(partition, []).append(
            Node(name, int(cpus.rstrip("+")), int(mem_mb.rstrip("+")), gpus, models))
    partitions, default = {}, None
    for line in filter(None, map(str.strip, partition_lines.splitlines())):
        name, limit, availability = line.split("|")
        if name.endswith("*"):
            name = default = name[:-1]
        partitions[name] = Partition(name, slurm_minutes(limit), availability == "up", tuple(nodes.get(name, ())),
                                     tuple(offline.get(name, ())))
    return partitions, default


def takes_jobs(state: str) -> bool:
    """Whether a node in ``sinfo %t`` state ``state`` takes new jobs (:data:`TAKES_JOBS`, and it responds)."""
    return "*" not in state and state.strip().rstrip("~#!%$@^-+").lower() in TAKES_JOBS


def parse_tres(text: str) -> dict[str, int]:
    """A TRES limit of ``sacctmgr`` (``cpu=64,gres/gpu=4,mem=500G``, ``gres/gpu:a100=2``) as ``{name: count}``:
    the entries whose value is a plain count (memory, written with its unit, is left out)."""
    entries = (entry.partition("=") for entry in text.strip().split(",") if "=" in entry)
    return {name: int(value) for name, _, value in entries if value.isdigit()}


def _count(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def parse_associations(lines: str) -> tuple[Association, ...]:
    """The user's associations from ``sacctmgr -nP show assoc user=<user> format=ASSOCIATION_FORMAT``."""
    found = []
    for line in filter(None, map(str.strip, lines.splitlines())):
        account, max_submit, default_qos, qos = (line.split("|") + [""] * 3)[:4]
        found.append(Association(account, _count(max_submit), default_qos or None,
                                 tuple(name for name in qos.split(",") if name)))
    return tuple(found)


def parse_qos(lines: str) -> dict[str, Qos]:
    """Each QoS's limits from ``sacctmgr -nP show qos format=QOS_FORMAT``."""
    found = {}
    for line in filter(None, map(str.strip, lines.splitlines())):
        name, max_submit, max_wall, per_user, per_job = (line.split("|") + [""] * 4)[:5]
        found[name] = Qos(name, _count(max_submit), slurm_minutes(max_wall), parse_tres(per_user),
                          parse_tres(per_job))
    return found


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
    associations = _output(run, ["sacctmgr", "-nP", "show", "assoc", f"user={user}",
                                 f"format={ASSOCIATION_FORMAT}"])
    qos = _output(run, ["sacctmgr", "-nP", "show", "qos", f"format={QOS_FORMAT}"])
    config = _output(run, ["scontrol", "show", "config"])
    enforce = re.search(r"^AccountingStorageEnforce\s*=\s*(.*)$", config or "", re.MULTILINE)
    return ClusterFacts(
        partitions, default,
        associations=None if associations is None else parse_associations(associations),
        qos=None if qos is None else parse_qos(qos),
        accounts_enforced=None if config is None else bool(enforce and "associations" in enforce.group(1)),
        user=user)
