"""The preflight: every job of a plan checked against the cluster's limits before anything is submitted.

A job that asks more GPUs than one node of its partition has, more time than its partition allows, more memory
or CPUs than its partition's largest node, a partition that does not exist or has no GPUs, or an account that is
not the user's would be rejected by sbatch or pend forever. :func:`refusals` finds every such job of a plan (its
rule, dataset and resources: :class:`JobRequest`) from the config's ``cluster`` block and what the cluster says
(:mod:`dpr_pipeline.orchestration.cluster_facts`), one message per kind of job naming the rule, what it asks, what the
cluster allows and the setting that fixes it. :func:`check_plan` raises them together (``make cluster-check``;
every run under a cluster executor, before its first submission: rules/common.smk's ``onstart``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from dpr_pipeline.errors import ConfigError
from dpr_pipeline import stages
from dpr_pipeline.orchestration.cluster_facts import ClusterFacts, Partition
from dpr_pipeline.orchestration.resources import nodes_of, requested_gpus


@dataclass(frozen=True)
class JobRequest:
    """What one job of the plan asks the scheduler for (``gpus``, ``threads``, ``mem_mb``: on each of its nodes)."""
    rule: str
    dataset: str | None
    gpus: int
    threads: int
    mem_mb: int
    runtime: int                 # minutes
    partition: str | None        # None: the cluster's default
    account: str | None
    shards: int = 1              # shard jobs run one after the other in this one submission (a shard group)
    nodes: int = 1               # a training over several nodes (its stage's `nodes`)


def job_request(rule: str, wildcards: Mapping[str, str], resources: Mapping[str, Any], threads: int) -> JobRequest:
    """A job's request from its rule name, wildcards and Snakemake resources (first attempt)."""
    return JobRequest(rule, wildcards.get("dataset"), requested_gpus(resources), int(threads),
                      int(resources.get("mem_mb") or 0), int(resources.get("runtime") or 0),
                      resources.get("slurm_partition"), resources.get("slurm_account"), nodes=nodes_of(resources))


def planned_requests(jobs, local_rules, group_sizes: Mapping[str, int] | None = None) -> list[JobRequest]:
    """The submissions of Snakemake jobs (a DAG's): not those of ``local_rules`` (run on the host Snakemake runs
    on: the fetch jobs, for example) nor those that run nothing; the shard jobs of a piece of work
    (:data:`dpr_pipeline.stages.SHARD_GROUPS`) in submissions of ``group_sizes[<its group>]`` shards each (Snakemake's
    ``--group-components``), one after the other on one GPU (``--resources shard_gpu=1``): the runtimes summed, the
    rest their largest."""
    group_sizes = group_sizes or {}
    requests, groups = [], {}
    for job in jobs:
        rule, wildcards = job.rule.name, dict(job.wildcards_dict)
        if rule in local_rules or job.rule.norun:
            continue
        request = job_request(rule, wildcards, dict(job.resources.items()), job.threads)
        template = stages.shard_group(rule) if rule in stages.SHARD_GROUPS else None
        if template is not None and group_sizes.get(template, 1) > 1:
            piece = tuple(wildcards.get(name) for name in stages.SHARD_GROUPS[rule])
            groups.setdefault((template, piece), []).append((int(wildcards.get("shard", 0)), request))
        else:
            requests.append(request)
    for (template, _), members in groups.items():
        members = [request for _, request in sorted(members, key=lambda member: member[0])]
        size = group_sizes[template]
        requests += [_in_series(members[start:start + size]) for start in range(0, len(members), size)]
    return requests


def check_shard_groups(group_sizes: Mapping[str, int], shard_gpu_limit: Any) -> None:
    """A shard group (``group_sizes``, Snakemake's ``--group-components``) runs its jobs one after the other on one
    GPU only under ``--resources shard_gpu=1`` (``shard_gpu_limit``; each shard job asks one, counted per group
    job): otherwise Snakemake sums their GPUs into one job whose shards all run at once on the same device."""
    grouped = sorted(name for name, size in group_sizes.items() if size > 1)
    if grouped and shard_gpu_limit != 1:
        raise ConfigError(f"group-components groups shard jobs ({', '.join(grouped)}) but --resources shard_gpu is "
                          f"{shard_gpu_limit}, not 1: each group job would ask the sum of its shards' GPUs and run "
                          "them at once on one device. Fix: add `resources: [shard_gpu=1]` to the profile (as "
                          "profiles/slurm does)")


def _in_series(members: list[JobRequest]) -> JobRequest:
    """One submission of shard jobs run one after the other (Snakemake's group resources under `shard_gpu=1`)."""
    first = members[0]
    return JobRequest(first.rule, first.dataset, max(m.gpus for m in members), max(m.threads for m in members),
                      max(m.mem_mb for m in members), sum(m.runtime for m in members), first.partition,
                      first.account, shards=len(members))


def _where(job: JobRequest) -> str:
    return f"rule {job.rule}" + (f" (dataset {job.dataset})" if job.dataset else "")


def _resources_key(job: JobRequest, key: str) -> str:
    return f"datasets.{job.dataset}.resources.{job.rule}.{key}" if job.dataset else f"resources.{job.rule}.{key}"


def _partition_key(job: JobRequest) -> str:
    return "cluster.gpu_partition" if job.gpus else "cluster.cpu_partition"


def _gpu_fix(job: JobRequest, most: int, partition: Partition | None) -> str:
    """A training's fix for nodes of ``most`` GPUs: the fewest ``nodes`` that share its processes evenly with at
    most ``most`` on each, where the partition has that many such nodes (or is not known); else fewer processes."""
    block = stages.GPU_TRAINING_RULES.get(job.rule)
    if block and job.dataset:
        processes = job.gpus * job.nodes
        nodes = next(n for n in range(1, processes + 1) if processes % n == 0 and processes // n <= most)
        if partition is None or sum(node.gpus >= processes // nodes for node in partition.nodes) >= nodes:
            share = processes // nodes
            return (f"set datasets.{job.dataset}.stages.{block}.nodes: {nodes} ({share} GPU{'s' * (share > 1)} on "
                    f"each of {nodes} nodes: the same {processes} processes and global batch), or a partition with "
                    f"larger nodes ({_partition_key(job)})")
        return (f"set datasets.{job.dataset}.stages.{block}.processes: {most} (the global batch stays the same; "
                f"micro_batch_size bounds each GPU's memory), or a partition with larger nodes "
                f"({_partition_key(job)})")
    return f"a partition with {job.gpus}-GPU nodes ({_partition_key(job)})"


def _job_refusals(job: JobRequest, config: Mapping[str, Any], facts: ClusterFacts | None) -> list[tuple[str, str]]:
    """``(kind, message)`` of each limit ``job`` breaks."""
    cluster = config.get("cluster") or {}
    found: list[tuple[str, str]] = []
    partition: Partition | None = None
    name = job.partition or (facts.default_partition if facts else None)
    if facts is not None:
        if name is None:
            found.append(("partition", f"{_where(job)}: no partition asked and the cluster has no default one; "
                                       f"fix: set {_partition_key(job)}"))
        else:
            missing = [part for part in name.split(",") if part not in facts.partitions]
            if missing:
                found.append(("partition", f"{_where(job)}: partition {', '.join(missing)} does not exist here "
                                           f"(sinfo: {', '.join(sorted(facts.partitions))}); fix: set "
                                           f"{_partition_key(job)} to one of them"))
            else:
                partition = facts.partitions[name.split(",")[0]]
    most_gpus = cluster.get("gpus_per_node")
    if partition is not None and job.gpus:
        on_nodes = partition.most("gpus")
        if on_nodes == 0:
            found.append(("no-gpus", f"{_where(job)}: asks {job.gpus} GPU(s) but partition {partition.name} has no "
                                     f"node with GPUs (sinfo %G); fix: set cluster.gpu_partition to a GPU partition"))
        elif most_gpus is not None and most_gpus > on_nodes:
            found.append(("gpus-per-node", f"cluster.gpus_per_node is {most_gpus} but the nodes of partition "
                                           f"{partition.name} have at most {on_nodes} GPUs (sinfo); fix: set "
                                           f"cluster.gpus_per_node: {on_nodes}"))
        most_gpus = on_nodes if most_gpus is None else min(most_gpus, on_nodes)
    if most_gpus and job.gpus > most_gpus:
        where = "on one node" if job.nodes == 1 else f"on each of {job.nodes} nodes"
        found.append(("gpus", f"{_where(job)}: asks {job.gpus} GPUs {where}; a node of the GPU partition has "
                              f"{most_gpus}; fix: {_gpu_fix(job, most_gpus, partition)}"))
    limit = partition.max_minutes if partition is not None else None
    if limit is not None and job.runtime > limit and job.shards > 1:
        fits = max(1, limit * job.shards // job.runtime)
        found.append(("runtime", f"{_where(job)}: asks {job.runtime} min for {job.shards} shard jobs run one after "
                                 f"the other; partition {partition.name} allows {limit} (sinfo %l); fix: "
                                 f"group-components {stages.shard_group(job.rule)}={fits} (snakemake's "
                                 "--group-components, or in your copy of the profile)"))
    elif limit is not None and job.runtime > limit:
        found.append(("runtime", f"{_where(job)}: asks {job.runtime} min; partition {partition.name} allows {limit} "
                                 f"(sinfo %l); fix: set cluster.max_runtime: {limit}"
                                 + (" (a training longer than that continues from its checkpoint in the next attempt)"
                                    if job.rule in stages.GPU_TRAINING_RULES else "")))
    if partition is not None and partition.nodes:
        for attribute, asked, unit, key in (("mem_mb", job.mem_mb, "MB of memory", "mem_mb"),
                                            ("cpus", job.threads, "CPUs", "threads")):
            most = partition.most(attribute)
            if asked > most:
                found.append((attribute, f"{_where(job)}: asks {asked} {unit}; the largest node of partition "
                                         f"{partition.name} has {most}; fix: {_resources_key(job, key)} at most "
                                         f"{most}, or a partition with larger nodes ({_partition_key(job)})"))
        fits = any(node.gpus >= job.gpus and node.mem_mb >= job.mem_mb and node.cpus >= job.threads
                   for node in partition.nodes)
        if not fits and not found:
            found.append(("node", f"{_where(job)}: asks {job.gpus} GPUs, {job.threads} CPUs and {job.mem_mb} MB "
                                  f"together, which no single node of partition {partition.name} has; fix: "
                                  f"{_resources_key(job, 'mem_mb')} or {_resources_key(job, 'threads')}"))
    if partition is not None and not partition.up:
        found.append(("down", f"{_where(job)}: partition {partition.name} is not up (sinfo %a); fix: wait, or set "
                              f"{_partition_key(job)}"))
    return found


def _account_refusals(config: Mapping[str, Any], facts: ClusterFacts | None, jobs_at_once: int | None) -> list[str]:
    account = (config.get("cluster") or {}).get("account")
    if facts is None or facts.accounts is None:
        return []
    found = []
    if account is not None and account not in facts.accounts:
        mine = ", ".join(sorted(facts.accounts)) or "none"
        found.append(f"cluster.account is {account!r}, which is not an account of user {facts.user} (sacctmgr: "
                     f"{mine}); fix: set cluster.account to one of them")
    if account is None and not facts.accounts and facts.accounts_enforced:
        found.append(f"user {facts.user} has no Slurm account and this cluster requires one (AccountingStorageEnforce="
                     "associations); fix: ask the cluster's administrators for one, then set cluster.account")
    limits = [limit for name, limit in facts.max_submit.items() if account is None or name == account]
    if jobs_at_once is not None and limits and jobs_at_once > min(limits):
        found.append(f"Snakemake may queue {jobs_at_once} jobs at once (--jobs, the profile's `jobs:`) but user "
                     f"{facts.user} may submit {min(limits)} (sacctmgr MaxSubmitJobs); fix: --jobs {min(limits)}")
    return found


def refusals(jobs: Iterable[JobRequest], config: Mapping[str, Any], facts: ClusterFacts | None,
             jobs_at_once: int | None = None) -> list[str]:
    """Every limit the plan's ``jobs`` break: one message per rule, dataset and kind of limit (with the number of
    jobs where more than one), the account's and the submit limit's (``jobs_at_once``: Snakemake's ``--jobs``)
    first. ``facts`` None: only the config's own limits (``cluster.gpus_per_node``)."""
    found = {message: None for message in _account_refusals(config, facts, jobs_at_once)}
    counts: dict[tuple, list] = {}
    for job in jobs:
        for kind, message in _job_refusals(job, config, facts):
            counts.setdefault((job.rule, job.dataset, kind), [message, 0])[1] += 1
    for message, number in counts.values():
        found[message + (f" [{number} jobs]" if number > 1 else "")] = None
    return list(found)


def check_plan(jobs: Iterable[JobRequest], config: Mapping[str, Any], facts: ClusterFacts | None,
               jobs_at_once: int | None = None) -> None:
    """Raise :class:`ConfigError` listing every refusal of :func:`refusals`; nothing is submitted then."""
    found = refusals(jobs, config, facts, jobs_at_once)
    if found:
        raise ConfigError("the cluster cannot run this plan as configured; nothing was submitted:\n  - "
                          + "\n  - ".join(found))
