"""A training over several nodes of a Slurm job: one ``torchrun`` per node, joined by a c10d rendezvous.

A stage with ``nodes: N`` (and ``processes: P``, P/N GPUs on each node) runs as one Slurm job of N nodes. The job's
own process (the launcher, on the job's first node) starts ``srun`` with one task per node (:func:`srun_command`);
each task runs ``python -m dpr_pipeline.training.nodes ...`` (:func:`run_node`), which reads the rendezvous from
its Slurm variables (:func:`slurm_rendezvous`: the step's first host, a port derived from the job id, the job id as
the rendezvous id; the same on every node) and becomes ``torchrun --nnodes N --nproc_per_node P/N --rdzv_backend
c10d ...`` (:func:`torchrun_command`). The workers' ``RANK`` and ``WORLD_SIZE`` are global (the cross-device
negatives gather over every node), ``LOCAL_RANK`` picks each node's GPU
(:class:`dpr_pipeline.training.distributed.Distributed`). One node stays ``torchrun --standalone``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Mapping

from dpr_pipeline.errors import ConfigError

#: The module every training process runs (with the spec file naming the function and its arguments).
WORKER_MODULE = "dpr_pipeline.training.launch"
#: The module each node's srun task runs: it becomes that node's torchrun (:func:`run_node`).
NODE_MODULE = "dpr_pipeline.training.nodes"
#: The ports a rendezvous may use, below Linux's ephemeral ports (32768-60999): every node derives the same one from
#: the job id (:func:`rendezvous_port`).
RENDEZVOUS_PORTS = range(20000, 30000)

# One entry of a Slurm hostlist: names and bracketed ranges (`gpu[01-04,07]`, `rack[1-2]-n[3-4]`).
_ENTRY = re.compile(r"(?:[^\[\],\s]+|\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\])+")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist expression (``SLURM_STEP_NODELIST``): ``gpu[01-04]`` -> ``gpu01``,
    ``gpu[3,5-6],cpu1`` -> ``gpu3``, ``node7,node9`` -> ``node7`` (what ``scontrol show hostnames | head -n 1``
    prints, without asking Slurm). ValueError for a text that is no hostlist."""
    text, depth, end = nodelist.strip(), 0, None
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = index
            break
    entry = text[:end]
    if not _ENTRY.fullmatch(entry):
        raise ValueError(f"{nodelist!r} is not a Slurm hostlist (e.g. gpu[01-04] or node1,node2)")
    return re.sub(r"\[(\d+)[^\]]*\]", r"\1", entry)


def rendezvous_port(job_id: str | int) -> int:
    """The rendezvous port of Slurm job ``job_id``: one of :data:`RENDEZVOUS_PORTS`, the same on every node of the
    job (no node can ask another which port is free), different for jobs whose ids differ by less than 10000."""
    return RENDEZVOUS_PORTS[int(job_id) % len(RENDEZVOUS_PORTS)]


@dataclass(frozen=True)
class Rendezvous:
    """Where the torchruns of a job's nodes meet: ``host:port`` (the host runs the c10d store), under ``id``."""
    host: str
    port: int
    id: str

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def slurm_rendezvous(environ: Mapping[str, str], nodes: int) -> Rendezvous:
    """The rendezvous of the srun step this task belongs to, from its Slurm variables: the step's first host
    (``SLURM_STEP_NODELIST``), the port of the job (``SLURM_JOB_ID``, :func:`rendezvous_port`), the job id as the
    rendezvous id. A step of other than ``nodes`` nodes (``SLURM_STEP_NUM_NODES``) is an error here rather than a
    rendezvous waiting for nodes that never come."""
    missing = [name for name in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES") if name not in environ]
    if missing:
        raise ConfigError(f"a training over {nodes} nodes runs one torchrun per node inside a Slurm job step (srun), "
                          f"but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set here. Fix: start "
                          f"it through the training job (dpr_pipeline.training.launch.run_training), under Slurm")
    if int(environ["SLURM_STEP_NUM_NODES"]) != nodes:
        raise ConfigError(f"the srun step runs on {environ['SLURM_STEP_NUM_NODES']} nodes "
                          f"({environ['SLURM_STEP_NODELIST']}), not the training's {nodes}. Fix: the job must ask "
                          f"for {nodes} nodes (the stage's `nodes` setting, rules/common.smk resources_of)")
    job = environ["SLURM_JOB_ID"]
    return Rendezvous(first_host(environ["SLURM_STEP_NODELIST"]), rendezvous_port(job), job)


def torchrun_command(processes_per_node: int, spec: str, nodes: int = 1,
                     rendezvous: Rendezvous | None = None) -> list[str]:
    """The ``torchrun`` of one node, starting ``processes_per_node`` workers of :data:`WORKER_MODULE` on ``spec``:
    ``--standalone`` on one node; over ``nodes`` > 1, ``--nnodes`` and the c10d ``rendezvous`` every node's
    torchrun joins (ranks numbered over all nodes)."""
    run = [sys.executable, "-m", "torch.distributed.run"]
    workers = ["--nproc_per_node", str(processes_per_node), "-m", WORKER_MODULE, spec]
    if nodes == 1:
        return [*run, "--standalone", *workers]
    if rendezvous is None:
        raise ValueError(f"a torchrun over {nodes} nodes needs their rendezvous")
    return [*run, "--nnodes", str(nodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", rendezvous.endpoint,
            "--rdzv_id", rendezvous.id, *workers]


def srun_command(nodes: int, processes_per_node: int, cpus_per_node: int, spec: str) -> list[str]:
    """The launcher's ``srun``: one task on each of the job's ``nodes`` nodes with its ``cpus_per_node`` CPUs and
    ``processes_per_node`` GPUs, each running :func:`run_node` (which becomes that node's torchrun); one task
    failing ends the others (``--kill-on-bad-exit``) rather than leaving them waiting in a collective. Every count
    is explicit: the job's Slurm variables are not passed to a Snakemake job's process."""
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus_per_node}",
            f"--gres=gpu:{processes_per_node}", "--kill-on-bad-exit=1",
            sys.executable, "-m", NODE_MODULE, str(nodes), str(processes_per_node), spec]


def processes_per_node(processes: int, nodes: int, setting: str) -> int:
    """The processes (GPUs) on each of ``nodes`` nodes: ``processes / nodes``, which must be whole (every node runs
    the same number of workers), else a ConfigError naming ``setting`` (the stage's ``nodes``) and the fix."""
    if nodes < 1 or processes % nodes:
        fits = [n for n in range(1, processes + 1) if processes % n == 0]
        raise ConfigError(f"{setting}: {nodes} nodes cannot share {processes} processes evenly (each node runs the "
                          f"same number, one per GPU). Fix: set it to one of {fits}, or processes to a multiple of "
                          f"{nodes}")
    return processes // nodes


def require_slurm_job(environ: Mapping[str, str], nodes: int, stage: str, setting: str) -> None:
    """A training over ``nodes`` > 1 nodes runs inside a Slurm job of that many nodes, starting ``srun``: elsewhere
    (a laptop, a local Snakemake run) a ConfigError naming the ``stage``, its ``setting`` (``nodes``) and the fix,
    never a training on fewer nodes than asked."""
    problem = ("this process is not in a Slurm job (no SLURM_JOB_ID)" if "SLURM_JOB_ID" not in environ
               else "srun is not on the PATH" if shutil.which("srun", path=environ.get("PATH")) is None else None)
    if problem is None:
        return
    raise ConfigError(f"{stage} training: {setting} is {nodes}: the training runs one torchrun on each of {nodes} "
                      f"nodes of its Slurm job, started by srun, but {problem}. Fix: run the workflow on the cluster "
                      f"(--profile slurm), or set {setting} to 1 (and processes to the GPUs of this machine) to train "
                      "here")


def run_node(nodes: int, per_node: int, spec: str, environ: Mapping[str, str]) -> None:
    """One node's srun task of a training over ``nodes`` nodes: becomes this node's torchrun of ``per_node``
    workers, joining the step's rendezvous (:func:`slurm_rendezvous`), so that signals reach torchrun itself."""
    command = torchrun_command(per_node, spec, nodes, slurm_rendezvous(environ, nodes))
    os.execv(command[0], command)


if __name__ == "__main__":
    run_node(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], os.environ)
