"""A proposed site file from what the cluster says (``make site``, scripts/site_probe.py), for the user to review.

:func:`probe_site` asks ``sinfo``, ``sacctmgr`` and ``scontrol`` (through
:func:`dpr_pipeline.orchestration.cluster_facts.read_cluster_facts` and its parsers, plus each partition's
``AllowQos``) and :func:`propose` turns the answers into ``cluster`` keys, each with the
command that gave it: the GPU partition (the one with GPU nodes), the CPU partition, the GPUs of a node, their type
where the GRES names one, the GPU partition's time limit, the account where the user has one, the QoS where one
applies. A key the answers do not settle is left commented out, saying why. :func:`site_text` writes them as YAML
with the schema's description above each key; without Slurm (no ``sinfo``), every key commented out: a template.
:func:`write_site` never replaces an existing site file: the proposal then goes beside it.
"""

from __future__ import annotations

import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.orchestration.cluster_facts import ClusterFacts, Partition, _output, read_cluster_facts
from dpr_pipeline.orchestration.config import SCHEMA_PATH


@dataclass(frozen=True)
class Proposal:
    """One cluster key of the proposed file: its value (``proposed`` False: left commented out) and where it comes
    from (the command that said it, or why it is left out)."""
    value: Any
    source: str
    proposed: bool = True


def scontrol_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show partition``: each partition's ``Key=Value`` fields by name."""
    records = {}
    for line in filter(None, map(str.strip, text.splitlines())):
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        records[fields.get("PartitionName", "")] = fields
    return records


def _listed(names) -> str:
    return ", ".join(sorted(names)) or "none"


def _longest(partition: Partition) -> float:
    return partition.max_minutes or float("inf")


def _gpu_partition(facts: ClusterFacts) -> tuple[Partition | None, Proposal]:
    """The partition with GPU nodes; of several (a node may be in more than one), the one up, named for GPUs, not
    the default, with the most GPUs a node, then the longest limit."""
    with_gpus = [p for p in facts.partitions.values() if p.most("gpus")]
    if not with_gpus:
        return None, Proposal(None, "sinfo -N: no partition has nodes with GPUs (%G)", proposed=False)
    chosen = max(with_gpus, key=lambda p: (p.up, "gpu" in p.name.lower(), p.name != facts.default_partition,
                                           p.most("gpus"), _longest(p), p.name))
    others = [f"{p.name} ({p.most('gpus')} a node)" for p in with_gpus if p is not chosen]
    return chosen, Proposal(chosen.name, "sinfo -N: the partition with GPU nodes (%G)"
                            + (f"; also with GPUs: {', '.join(others)}" if others else ""))


def _cpu_partition(facts: ClusterFacts, gpu: Partition | None) -> Proposal:
    """A partition up other than the GPU one: one without GPU nodes, the default one, then the longest limit."""
    others = [p for p in facts.partitions.values() if p.up and p is not gpu]
    if not others:
        return Proposal(None, "sinfo: no partition up other than the GPU one: CPU jobs go to the default partition",
                        proposed=False)
    chosen = max(others, key=lambda p: (not p.most("gpus"), p.name == facts.default_partition, _longest(p), p.name))
    return Proposal(chosen.name, "sinfo -N: " + ("a partition without GPU nodes" if not chosen.most("gpus") else
                                                 "a partition other than the GPU one")
                    + (" (the default, * in sinfo)" if chosen.name == facts.default_partition else ""))


def _gpu_model(partition: Partition) -> Proposal:
    models = {model for node in partition.nodes for model in node.gpu_models}
    if len(models) == 1:
        return Proposal(models.pop(), f"sinfo -N: the GPU type of partition {partition.name}'s GRES (%G)")
    why = (f"several GPU types ({_listed(models)}): name one to ask for it" if models else
           "untyped GRES (gpu:N): no type to ask for")
    return Proposal(None, f"sinfo -N: {why}; null asks any GPU", proposed=False)


def _account(facts: ClusterFacts) -> Proposal:
    command = f"sacctmgr show assoc user={facts.user}"
    if facts.accounts is None:
        return Proposal(None, f"{command} did not answer: set your account, or null for your default",
                        proposed=False)
    if len(facts.accounts) == 1:
        return Proposal(next(iter(facts.accounts)), f"{command}: your one account")
    if facts.accounts:
        return Proposal(None, f"{command}: your accounts are {_listed(facts.accounts)}: set one (null: your "
                        "default)", proposed=False)
    required = " (this cluster requires one: ask its administrators)" if facts.accounts_enforced else ""
    return Proposal(None, f"{command}: you have no account{required}", proposed=False)


def _qos(partition: Partition, record: dict[str, str] | None, yours: set[str] | None) -> Proposal:
    """The QoS the GPU partition lets the user's jobs run under, where exactly one applies."""
    command = f"scontrol show partition {partition.name}"
    if record is None:
        return Proposal(None, f"{command} did not answer", proposed=False)
    allowed = record.get("AllowQos", "ALL")
    if allowed == "ALL":
        return Proposal(None, f"{command}: AllowQos=ALL: your default QoS applies", proposed=False)
    candidates = set(allowed.split(",")) & yours if yours is not None else set(allowed.split(","))
    where = f"{command}: AllowQos={allowed}" + (f"; sacctmgr show assoc: yours {_listed(yours)}"
                                                if yours is not None else "")
    if len(candidates) == 1:
        return Proposal(next(iter(candidates)), where)
    return Proposal(None, f"{where}: {'set one of ' + _listed(candidates) if candidates else 'none of yours'}",
                    proposed=False)


def _max_runtime(partition: Partition, qos_name: str | None, facts: ClusterFacts) -> Proposal:
    """The GPU partition's time limit, or the MaxWall of the QoS the jobs run under (``qos_name``) where shorter."""
    limit = partition.max_minutes
    source = f"sinfo: partition {partition.name}'s time limit (%l)"
    qos = (facts.qos or {}).get(qos_name)
    qos_limit = qos.max_wall if qos is not None else None
    if qos_limit is not None and (limit is None or qos_limit < limit):
        return Proposal(qos_limit, f"sacctmgr show qos {qos_name}: MaxWall, below {source}")
    if limit is None:
        return Proposal(None, f"{source} is INFINITE: no cap", proposed=False)
    return Proposal(limit, source)


def propose(facts: ClusterFacts, partitions_text: str | None) -> dict[str, Proposal]:
    """The cluster keys the answers settle (and those they leave open, not proposed): ``facts`` from
    :func:`read_cluster_facts` (partitions, the user's associations and their QoS, the QoS limits),
    ``partitions_text`` from ``scontrol -o show partition`` (None: it did not answer)."""
    gpu, gpu_partition = _gpu_partition(facts)
    account = _account(facts)
    found = {"gpu_partition": gpu_partition, "cpu_partition": _cpu_partition(facts, gpu), "account": account}
    if gpu is None:
        return found
    found["gpus_per_node"] = Proposal(gpu.most("gpus"), f"sinfo -N: the most GPUs of a node of partition {gpu.name} "
                                                        "(%G)")
    found["gpu_model"] = _gpu_model(gpu)
    associations = None if facts.associations is None else [
        a for a in facts.associations if not account.proposed or a.account == account.value]
    yours = None if associations is None else {qos for a in associations for qos in a.qos}
    found["qos"] = _qos(gpu, scontrol_partitions(partitions_text or "").get(gpu.name), yours)
    defaults = {a.job_qos() for a in associations or ()}
    applies = found["qos"].value if found["qos"].proposed else defaults.pop() if len(defaults) == 1 else None
    found["max_runtime"] = _max_runtime(gpu, applies, facts)
    return found


def probe_site(run: Callable = subprocess.run, user: str | None = None) -> dict[str, Proposal] | None:
    """:func:`propose` from this host's cluster; None where ``sinfo`` does not answer (not a Slurm host)."""
    facts = read_cluster_facts(run, user)
    if facts is None:
        return None
    return propose(facts, _output(run, ["scontrol", "-o", "show", "partition"]))


def _scalar(value: Any) -> str:
    """``value`` as a YAML scalar."""
    return yaml.safe_dump([value], default_flow_style=True, width=1000).strip()[1:-1]


def site_text(found: dict[str, Proposal] | None, schema_path: str | Path = SCHEMA_PATH, header: str = "") -> str:
    """The site file of ``found`` (None: the template, every key commented out at its default) under the comment
    ``header``, each key under its description from the schema, a proposed one with the command that gave it,
    another commented out with why."""
    keys = yaml.safe_load(Path(schema_path).read_text())["properties"]["cluster"]["properties"]
    lines = textwrap.wrap(header, 116, initial_indent="# ", subsequent_indent="# ") + ["cluster:"]
    for key, spec in keys.items():
        lines += [""] if lines[-1] != "cluster:" else []
        lines += textwrap.wrap(" ".join(spec["description"].split()), 114, initial_indent="  # ",
                               subsequent_indent="  # ", break_on_hyphens=False, break_long_words=False)
        proposal = (found or {}).get(key)
        if proposal is not None and proposal.proposed:
            lines.append(f"  {key}: {_scalar(proposal.value)}   # {proposal.source}")
        else:
            lines.append(f"  # {key}: {_scalar(spec.get('default'))}"
                         + (f"   # {proposal.source}" if proposal is not None else ""))
    return "\n".join(lines) + "\n"


def write_site(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path``, or beside it as ``<name>.proposed.yaml`` where ``path`` exists (a site file is
    never replaced); the file written."""
    path = Path(path)
    if path.exists():
        path = path.with_name(f"{path.stem}.proposed{path.suffix}")
    with atomic_output(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return path
