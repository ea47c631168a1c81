"""Peak memory of each Slurm job on this node, from ``/proc``, for the scale rehearsal (``scripts/rehearsal.py``).

Snakemake's ``benchmark:`` and Slurm's ``jobacct_gather/linux`` (the test cluster's ``JobAcctGatherFrequency=30``)
sample every 30 s and miss short peaks. :class:`JobMemoryMonitor` polls ``/proc`` every ``interval`` seconds
(0.2 by default) and files every process under the Slurm job named by ``SLURM_JOB_ID`` in its environment (the
batch script, Snakemake's job runner, the rule's script, torchrun's workers, BM25's Java). Per job it keeps two
figures, and a job's peak is the larger:

* ``sum_rss_mb``: the largest sum of the job's processes' resident memory (``VmRSS``) in one sample: what
  processes running side by side hold together (sampled, so it can miss a peak shorter than ``interval``);
* ``process_hwm_mb``: the largest high-water mark (``VmHWM``, kept by the kernel: exact) of any one of its
  processes, read at each sample, so it misses only what a process reaches in its last ``interval`` before it
  exits.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class JobPeak:
    sum_rss_mb: float = 0.0
    process_hwm_mb: float = 0.0
    processes: set[int] = field(default_factory=set)

    @property
    def peak_mb(self) -> float:
        return max(self.sum_rss_mb, self.process_hwm_mb)


def slurm_job_of(environ: bytes) -> str | None:
    """``SLURM_JOB_ID`` from a ``/proc/<pid>/environ`` (NUL-separated ``NAME=value``), None without it."""
    for entry in environ.split(b"\0"):
        if entry.startswith(b"SLURM_JOB_ID="):
            return entry.split(b"=", 1)[1].decode()
    return None


def status_memory_mb(status: str) -> tuple[float, float]:
    """``(VmRSS, VmHWM)`` in MB from a ``/proc/<pid>/status`` text (0 where absent: kernel threads, zombies)."""
    values = {}
    for line in status.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024          # kB
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


class JobMemoryMonitor:
    """Polls ``proc`` (``/proc``) every ``interval`` seconds in a thread between :meth:`start` and :meth:`stop`;
    :attr:`jobs` maps each Slurm job id seen to its :class:`JobPeak`."""

    def __init__(self, proc: str | Path = "/proc", interval: float = 0.2):
        self.proc, self.interval = Path(proc), interval
        self.jobs: dict[str, JobPeak] = {}
        self._job_of_pid: dict[int, str | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """One pass over the processes: each job's summed VmRSS and its processes' VmHWM."""
        pids = {int(name) for name in os.listdir(self.proc) if name.isdigit()}
        self._job_of_pid = {pid: job for pid, job in self._job_of_pid.items() if pid in pids}
        totals: dict[str, float] = {}
        for pid in pids:
            try:
                if pid not in self._job_of_pid:
                    self._job_of_pid[pid] = slurm_job_of((self.proc / str(pid) / "environ").read_bytes())
                job = self._job_of_pid[pid]
                if job is None:
                    continue
                rss, hwm = status_memory_mb((self.proc / str(pid) / "status").read_text())
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue                                   # gone between the listing and the read
            peak = self.jobs.setdefault(job, JobPeak())
            peak.process_hwm_mb = max(peak.process_hwm_mb, hwm)
            peak.processes.add(pid)
            totals[job] = totals.get(job, 0.0) + rss
        for job, total in totals.items():
            self.jobs[job].sum_rss_mb = max(self.jobs[job].sum_rss_mb, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "JobMemoryMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
