"""The preflight: every job of a plan checked against the cluster's limits before anything is submitted.

A job that asks more GPUs than one node of its partition has (or GPUs of a type its nodes lack), more time than
its partition or QoS allows, more memory or CPUs than its partition's largest node, more GPUs than its QoS allows, a
partition that does not exist or has no GPUs, an account that is not the user's or a QoS the cluster lacks, and
more jobs queued at once than the user may submit, would be rejected by sbatch or pend forever. :func:`refusals`
finds every such job of a plan (its rule, dataset and resources: :class:`JobRequest`), at its first attempt and at
the largest its retries can make, from the config's ``cluster`` block and what the cluster says
(:mod:`dpr_pipeline.orchestration.cluster_facts`), one message per kind of job naming the rule, what it asks, what the
cluster allows and the setting that fixes it. :func:`check_plan` raises them together (``make cluster-check``;
every run under a cluster executor, before its first submission: rules/common.smk's ``onstart``). The same facts
bound how far a retry grows (:func:`retry_caps`, which the rules' resources read).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from dpr_pipeline.errors import ConfigError
from dpr_pipeline import stages
from dpr_pipeline.orchestration.cluster_facts import Association, ClusterFacts, Partition, Qos
from dpr_pipeline.orchestration.cluster_site import site_label
from dpr_pipeline.orchestration.resources import cluster_resources, job_runtime, nodes_of, requested_gpus, scaled


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
    attempts: int = 1            # the most attempts Snakemake makes (its rule's retries + 1)
    attempt: int = 1             # which attempt this request is
    nodes: int = 1               # a training over several nodes (its stage's `nodes`)


def job_request(rule: str, wildcards: Mapping[str, str], resources: Mapping[str, Any], threads: int) -> JobRequest:
    """A job's request from its rule name, wildcards and Snakemake resources (first attempt)."""
    return JobRequest(rule, wildcards.get("dataset"), requested_gpus(resources), int(threads),
                      int(resources.get("mem_mb") or 0), int(resources.get("runtime") or 0),
                      resources.get("slurm_partition"), resources.get("slurm_account"), nodes=nodes_of(resources))


def _group_size(rule: str, group_sizes: Mapping[str, int] | None) -> int:
    """The shard jobs of ``rule`` one submission runs (``group_sizes``: Snakemake's ``--group-components``); 1 for
    a rule whose jobs are not grouped."""
    return (group_sizes or {}).get(stages.shard_group(rule), 1) if rule in stages.SHARD_GROUPS else 1


def planned_requests(jobs, local_rules, group_sizes: Mapping[str, int] | None = None,
                     retries: Mapping[str, int] | None = None) -> list[JobRequest]:
    """The submissions of Snakemake jobs (a DAG's): not those of ``local_rules`` (run on the host Snakemake runs
    on: the fetch jobs, for example) nor those that run nothing; the shard jobs of a piece of work
    (:data:`dpr_pipeline.stages.SHARD_GROUPS`) in submissions of ``group_sizes[<its group>]`` shards each (Snakemake's
    ``--group-components``), one after the other on one GPU (``--resources shard_gpu=1``): the runtimes summed, the
    rest their largest. ``retries``: per rule, the retries Snakemake gives its jobs (none where not named)."""
    requests, groups = [], {}
    for job in jobs:
        rule, wildcards = job.rule.name, dict(job.wildcards_dict)
        if rule in local_rules or job.rule.norun:
            continue
        request = replace(job_request(rule, wildcards, dict(job.resources.items()), job.threads),
                          attempts=1 + (retries or {}).get(rule, 0))
        if _group_size(rule, group_sizes) > 1:
            piece = (stages.shard_group(rule), tuple(wildcards.get(name) for name in stages.SHARD_GROUPS[rule]))
            groups.setdefault(piece, []).append((int(wildcards.get("shard", 0)), request))
        else:
            requests.append(request)
    for members in groups.values():
        members = [request for _, request in sorted(members, key=lambda member: member[0])]
        size = _group_size(members[0].rule, group_sizes)
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
                      first.account, shards=len(members), attempts=first.attempts)


@dataclass(frozen=True)
class RetryCaps:
    """The most a retry of a rule's jobs may grow to (None: no cap): memory in MB, runtime in minutes."""
    mem_mb: int | None = None
    runtime: int | None = None


def _partition_of(name: str | None, facts: ClusterFacts) -> Partition | None:
    """The partition a job asking ``name`` (a comma-separated list: its first; None: the default) gets."""
    name = name or facts.default_partition
    return facts.partitions.get(name.split(",")[0]) if name else None


def _gpu_nodes(partition: Partition, config: Mapping[str, Any], gpu_job: bool) -> Partition:
    """``partition`` as a job sees it: for a GPU job asking a type (``cluster.gpu_model``), only its nodes with GPUs
    of that type."""
    model = (config.get("cluster") or {}).get("gpu_model")
    if not gpu_job or not model:
        return partition
    return replace(partition, nodes=tuple(node for node in partition.nodes if model in node.gpu_models))


def _associations(config: Mapping[str, Any], facts: ClusterFacts) -> list[Association]:
    """The user's associations the jobs may run under: cluster.account's, or every one where it is null."""
    account = (config.get("cluster") or {}).get("account")
    return [a for a in facts.associations or () if account is None or a.account == account]


def _job_qos(config: Mapping[str, Any], facts: ClusterFacts | None) -> list[Qos]:
    """The QoS whose limits the jobs run under, as far as ``sacctmgr`` tells: ``cluster.qos``, else the default
    (or only) QoS of each association the jobs may run under; none where unknown."""
    if facts is None or facts.qos is None:
        return []
    named = (config.get("cluster") or {}).get("qos")
    names = {named} if named else {association.job_qos() for association in _associations(config, facts)}
    return [facts.qos[name] for name in sorted(names - {None}) if name in facts.qos]


def _time_limit(partition: Partition | None, qos: list[Qos]) -> tuple[int, str] | None:
    """The smallest time limit of the partition's (``sinfo %l``) and the QoS's (``MaxWall``), with what says so."""
    limits = [(q.max_wall, f"QoS {q.name} allows {q.max_wall} (sacctmgr MaxWall)") for q in qos]
    if partition is not None:
        limits.append((partition.max_minutes, f"partition {partition.name} allows {partition.max_minutes} (sinfo %l)"))
    return min(((minutes, said) for minutes, said in limits if minutes is not None), default=None)


def retry_caps(config: Mapping[str, Any], facts: ClusterFacts | None, rule: str,
               group_sizes: Mapping[str, int] | None = None) -> RetryCaps:
    """What a retry of ``rule``'s jobs may grow to on this cluster (``fetch``: the fetch jobs): the memory of the
    largest node of its partition (with GPUs of ``cluster.gpu_model`` for a GPU rule asking a type), and the
    smaller of its partition's time limit and its QoS's ``MaxWall``, shared among the shard jobs one submission runs
    one after the other (``group_sizes``); nothing where ``facts`` is None (no ``sinfo``: a dry run, off the
    cluster). A job's first attempt is as configured (and checked by :func:`refusals`)."""
    if facts is None:
        return RetryCaps()
    gpu_rule = rule in stages.GPU_RULES
    partition = _partition_of(cluster_resources(config, gpu_rule).get("slurm_partition"), facts)
    largest = _gpu_nodes(partition, config, gpu_rule).most("mem_mb") if partition is not None else 0
    limit = _time_limit(partition, _job_qos(config, facts))
    return RetryCaps(largest or None, limit[0] // _group_size(rule, group_sizes) if limit else None)


def _largest_attempt(job: JobRequest, config: Mapping[str, Any], caps: RetryCaps) -> JobRequest:
    """``job``'s last attempt, every earlier one failed: memory and runtime grown as the rules grow them
    (rules/common.smk's resources_of), each shard of a group by its own."""
    member_runtime = job_runtime(config, job.runtime // job.shards, job.attempts, caps.runtime)
    return replace(job, mem_mb=scaled(job.mem_mb, job.attempts, caps.mem_mb), runtime=member_runtime * job.shards,
                   attempt=job.attempts)


def _where(job: JobRequest) -> str:
    return (f"rule {job.rule}" + (f" (dataset {job.dataset})" if job.dataset else "")
            + (f", its attempt {job.attempt} after {job.attempt - 1} failed" if job.attempt > 1 else ""))


def _resources_key(job: JobRequest, key: str) -> str:
    return f"datasets.{job.dataset}.resources.{job.rule}.{key}" if job.dataset else f"resources.{job.rule}.{key}"


def _in_site(setting: str) -> str:
    """A fix's cluster key (with its value) and the file to set it in: the site file, or how to make one
    (:mod:`dpr_pipeline.orchestration.cluster_site`)."""
    return f"{setting} in {site_label()}"


def _partition_key(job: JobRequest) -> str:
    return _in_site("cluster.gpu_partition" if job.gpus else "cluster.cpu_partition")


def _gpu_fix(job: JobRequest, most: int, otherwise: str, partition: Partition | None = None,
             across_nodes: bool = False) -> str:
    """The fix of a training asking more GPUs than ``most``: with ``across_nodes``, the fewest ``nodes`` that share
    its processes evenly with at most ``most`` on each, where ``partition`` has that many such nodes (or is not
    known); else fewer processes; or ``otherwise`` (a job that is no training: that alone)."""
    block = stages.GPU_TRAINING_RULES.get(job.rule)
    if block and job.dataset and most:
        processes = job.gpus * job.nodes
        nodes = next(n for n in range(1, processes + 1) if processes % n == 0 and processes // n <= most)
        if across_nodes and (partition is None or
                             sum(node.gpus >= processes // nodes for node in partition.nodes) >= nodes):
            share = processes // nodes
            return (f"set datasets.{job.dataset}.stages.{block}.nodes: {nodes} ({share} GPU{'s' * (share > 1)} on "
                    f"each of {nodes} nodes: the same {processes} processes and global batch), or {otherwise}")
        return (f"set datasets.{job.dataset}.stages.{block}.processes: {most} (the global batch stays the same; "
                f"micro_batch_size bounds each GPU's memory), or {otherwise}")
    return otherwise


def _gpu_model_refusal(job: JobRequest, model: str, partition: Partition) -> str:
    models = sorted({name for node in partition.nodes for name in node.gpu_models})
    have = (f"GPUs of type {', '.join(models)} (sinfo %G); fix: set {_in_site('cluster.gpu_model')} to one of "
            "them, or null"
            if models else "GPUs without a type (sinfo %G: gpu:N), which no typed request gets; fix: set "
                           f"{_in_site('cluster.gpu_model: null')}")
    return (f"{_where(job)}: asks GPUs of type {model} (cluster.gpu_model); the nodes of partition "
            f"{partition.name} have {have}")


def _qos_gpu_refusals(job: JobRequest, model: str | None, qos: list[Qos]) -> list[tuple[str, str]]:
    """A job asking more GPUs than a QoS lets one user (``MaxTRESPU``) or one job (``MaxTRES``) have."""
    names = ["gres/gpu"] + ([f"gres/gpu:{model}"] if model else [])
    found = []
    for q in qos:
        limits = [(tres[name], f"{field} {name}={tres[name]}") for field, tres in
                  (("MaxTRESPU", q.max_tres_per_user), ("MaxTRES", q.max_tres_per_job)) for name in names
                  if name in tres]
        if limits and job.gpus > min(limits)[0]:
            most, said = min(limits)
            fix = _gpu_fix(job, most, f"a QoS that allows {job.gpus} ({_in_site('cluster.qos')})")
            found.append(("qos-gpus", f"{_where(job)}: asks {job.gpus} GPUs; QoS {q.name} allows {most} (sacctmgr "
                                       f"{said}); fix: {fix}"))
    return found


def _job_refusals(job: JobRequest, config: Mapping[str, Any], facts: ClusterFacts | None) -> list[tuple[str, str]]:
    """``(kind, message)`` of each limit ``job`` breaks."""
    cluster = config.get("cluster") or {}
    model = cluster.get("gpu_model")
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
                partition = _partition_of(name, facts)
    if partition is not None and partition.offline and not partition.nodes:
        found.append(("offline", f"{_where(job)}: no node of partition {partition.name} takes jobs (sinfo %t: "
                                 f"{', '.join(partition.offline)}); fix: wait until its nodes are back, or set "
                                 f"{_partition_key(job)} to another partition"))
        return found
    most_gpus = cluster.get("gpus_per_node")
    if partition is not None and job.gpus:
        on_nodes = partition.most("gpus")
        typed = _gpu_nodes(partition, config, True)
        if on_nodes == 0:
            found.append(("no-gpus", f"{_where(job)}: asks {job.gpus} GPU(s) but partition {partition.name} has no "
                                     f"node with GPUs (sinfo %G); fix: set {_in_site('cluster.gpu_partition')} to a "
                                     "GPU partition"))
        elif not typed.nodes:
            found.append(("gpu-model", _gpu_model_refusal(job, model, partition)))
        else:
            partition, on_nodes = typed, typed.most("gpus")
            if most_gpus is not None and most_gpus > on_nodes:
                found.append(("gpus-per-node", f"cluster.gpus_per_node is {most_gpus} but the nodes of partition "
                                               f"{partition.name} have at most {on_nodes} GPUs (sinfo); fix: set "
                                               f"{_in_site(f'cluster.gpus_per_node: {on_nodes}')}"))
        most_gpus = on_nodes if most_gpus is None else min(most_gpus, on_nodes)
    if most_gpus and job.gpus > most_gpus:
        where = "on one node" if job.nodes == 1 else f"on each of {job.nodes} nodes"
        fix = _gpu_fix(job, most_gpus, f"a partition with {job.gpus}-GPU nodes ({_partition_key(job)})", partition,
                       across_nodes=True)
        found.append(("gpus", f"{_where(job)}: asks {job.gpus} GPUs {where}; a node of the GPU partition has "
                              f"{most_gpus}; fix: {fix}"))
    qos = _job_qos(config, facts)
    if job.gpus:
        found += _qos_gpu_refusals(job, model, qos)
    limit = _time_limit(partition, qos)
    if limit is not None and job.runtime > limit[0] and job.shards > 1:
        fits = max(1, limit[0] * job.shards // job.runtime)
        found.append(("runtime", f"{_where(job)}: asks {job.runtime} min for {job.shards} shard jobs run one after "
                                 f"the other; {limit[1]}; fix: group-components {stages.shard_group(job.rule)}={fits} "
                                 "(snakemake's --group-components, or in your copy of the profile)"))
    elif limit is not None and job.runtime > limit[0]:
        found.append(("runtime", f"{_where(job)}: asks {job.runtime} min; {limit[1]}; fix: set "
                                 f"{_in_site(f'cluster.max_runtime: {limit[0]}')}"
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
                                  f"{_resources_key(job, 'mem_mb')} or {_resources_key(job, 'threads')}"
                                  + (", or fewer retries (--retries)" if job.attempt > 1 else "")))
    if partition is not None and not partition.up:
        found.append(("down", f"{_where(job)}: partition {partition.name} is not up (sinfo %a); fix: wait, or set "
                              f"{_partition_key(job)}"))
    return found


def _account_refusals(config: Mapping[str, Any], facts: ClusterFacts | None, jobs_at_once: int | None) -> list[str]:
    cluster = config.get("cluster") or {}
    account, named_qos = cluster.get("account"), cluster.get("qos")
    if facts is None:
        return []
    found = []
    if facts.accounts is not None and account is not None and account not in facts.accounts:
        mine = ", ".join(sorted(facts.accounts)) or "none"
        found.append(f"cluster.account is {account!r}, which is not an account of user {facts.user} (sacctmgr: "
                     f"{mine}); fix: set {_in_site('cluster.account')} to one of them")
    if facts.accounts is not None and account is None and not facts.accounts and facts.accounts_enforced:
        found.append(f"user {facts.user} has no Slurm account and this cluster requires one (AccountingStorageEnforce="
                     f"associations); fix: ask the cluster's administrators for one, then set "
                     f"{_in_site('cluster.account')}")
    if facts.qos is not None and named_qos is not None and named_qos not in facts.qos:
        found.append(f"cluster.qos is {named_qos!r}, which is not a QoS of this cluster (sacctmgr show qos: "
                     f"{', '.join(sorted(facts.qos)) or 'none'}); fix: set {_in_site('cluster.qos')} to one of "
                     "them, or null")
    limits = [(a.max_submit, "sacctmgr MaxSubmitJobs") for a in _associations(config, facts)
              if a.max_submit is not None]
    limits += [(q.max_submit_per_user, f"sacctmgr QoS {q.name} MaxSubmitPU") for q in _job_qos(config, facts)
               if q.max_submit_per_user is not None]
    if jobs_at_once is not None and limits and jobs_at_once > min(limits)[0]:
        most, said = min(limits)
        found.append(f"Snakemake may queue {jobs_at_once} jobs at once (--jobs, the profile's `jobs:`) but user "
                     f"{facts.user} may submit {most} ({said}); fix: --jobs {most} (or `jobs: {most}` in your copy "
                     "of the profile)")
    return found


def refusals(jobs: Iterable[JobRequest], config: Mapping[str, Any], facts: ClusterFacts | None,
             jobs_at_once: int | None = None, group_sizes: Mapping[str, int] | None = None) -> list[str]:
    """Every limit the plan's ``jobs`` break, at their first attempt and at the last their retries can make (grown
    as far as :func:`retry_caps` lets it, the shard groups of ``group_sizes``): one message per rule, dataset and
    kind of limit (with the number of jobs where more than one), the account's, the QoS's and the submit limit's
    (``jobs_at_once``: Snakemake's ``--jobs``) first. ``facts`` None: only the config's own limits
    (``cluster.gpus_per_node``)."""
    found = {message: None for message in _account_refusals(config, facts, jobs_at_once)}
    counts: dict[tuple, list] = {}
    for job in jobs:
        first = _job_refusals(job, config, facts)
        last = _largest_attempt(job, config, retry_caps(config, facts, job.rule, group_sizes))
        kinds = {kind for kind, _ in first}
        retried = [(f"retry {kind}", message) for kind, message in _job_refusals(last, config, facts)
                   if kind not in kinds] if last.attempt > 1 else []
        for kind, message in first + retried:
            counts.setdefault((job.rule, job.dataset, kind), [message, 0])[1] += 1
    for message, number in counts.values():
        found[message + (f" [{number} jobs]" if number > 1 else "")] = None
    return list(found)


def check_plan(jobs: Iterable[JobRequest], config: Mapping[str, Any], facts: ClusterFacts | None,
               jobs_at_once: int | None = None, group_sizes: Mapping[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` listing every refusal of :func:`refusals`; nothing is submitted then."""
    found = refusals(jobs, config, facts, jobs_at_once, group_sizes)
    if found:
        raise ConfigError("the cluster cannot run this plan as configured; nothing was submitted:\n  - "
                          + "\n  - ".join(found))
