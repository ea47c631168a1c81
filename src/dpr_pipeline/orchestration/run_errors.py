"""What a failed run shows last: the project's own message (file, line or row, problem, ``Fix:``), not a traceback.

Jobs: ``orchestration.job_log.logged`` writes a failing job's traceback to its log and its message to the job's error file
(:func:`~dpr_pipeline.layout.error_file`; :func:`write_job_error`). The Snakefile's ``onerror`` gathers the
failed jobs' messages (:func:`failed_jobs_report`). Snakemake prints a few lines of its own after ``onerror``
and ends with its error (``At least one job did not complete successfully.``); :class:`LastLines`, a filter on
Snakemake's logger, puts the report in that error's place, so the report is what the terminal ends with.

The same filter replaces Snakemake's rendering of an error raised while it reads the workflow or builds the job
graph (its class, the Snakefile line and a traceback below the message) with the message of the
:class:`~dpr_pipeline.errors.PipelineError` behind it (:func:`explain`): a config error at start-up, one
raised in an input function; and explains a target that names a dataset the config lacks, or a folder no
rule writes, instead of Snakemake's ``MissingRuleException``, and a dataset's raw files missing from the working
directory instead of its ``MissingInputException`` (:mod:`~dpr_pipeline.orchestration.run_folders`). The full
traceback stays in Snakemake's ``--verbose`` output. docs/bad_inputs.md, "Under Snakemake".
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from dpr_pipeline.errors import ConfigError, PipelineError
from dpr_pipeline.layout import RESULTS, error_file
from dpr_pipeline.orchestration.run_folders import missing_raw_files


def job_error_line(error: BaseException) -> str:
    """``<error type>: <message>``: the line a job that stopped on ``error`` shows."""
    return f"{type(error).__name__}: {error}"


def write_job_error(path: str | Path, error: BaseException) -> None:
    """The job's error file: the error's type and message, and whether it is the user's to fix (a
    :class:`PipelineError`) or a bug."""
    Path(path).write_text(json.dumps({"error": type(error).__name__, "message": str(error),
                                      "expected": isinstance(error, PipelineError)}) + "\n", encoding="utf-8")


def read_job_error(path: str | Path) -> dict | None:
    """What :func:`write_job_error` wrote, or None (no file: the job was killed, or never started its script)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class FailedJob:
    """A job Snakemake gave up on: its rule, wildcards and log files."""
    rule: str
    wildcards: dict = field(default_factory=dict)
    logs: tuple[str, ...] = ()

    def name(self) -> str:
        values = ", ".join(f"{key}={value}" for key, value in self.wildcards.items())
        return f"{self.rule} ({values})" if values else self.rule


def failed_jobs_report(jobs: Iterable[FailedJob], snakemake_logs: Iterable[str] = ()) -> str:
    """The run's last lines: per failed job, its name and log, then its message (the last line of its block)."""
    jobs = list(jobs)
    logs = ", ".join(str(p) for p in snakemake_logs)
    lines = [f"{len(jobs)} job{'s' if len(jobs) != 1 else ''} failed; each job's traceback is in its log"
             + (f" (Snakemake's log: {logs})" if logs else "") + ":"]
    for job in jobs:
        log = job.logs[0] if job.logs else None
        error = read_job_error(error_file(log)) if log else None
        lines.append(f"- {job.name()}" + (f", log {log}:" if log else ":"))
        if error is None:
            lines.append("  stopped without a message of its own (killed for time or memory, or its script never "
                         "started): see Snakemake's error block above" + (" and the log" if log else ""))
        elif error["expected"]:
            lines.append(f"  {error['error']}: {error['message']}")
        else:
            lines.append(f"  an unexpected {error['error']} (a bug: the traceback is above and in the log): "
                         f"{error['message']}")
    return "\n".join(lines)


def unknown_target(target: str, datasets: Iterable[str], folders: Iterable[str]) -> str | None:
    """Why no rule makes ``target`` when its path names a dataset the config lacks, or a folder under a dataset's
    results that no rule writes (``folders``: those that exist); None otherwise (Snakemake's message stands)."""
    datasets = list(datasets)
    parts = Path(target).parts
    if len(parts) < 2 or parts[0] != RESULTS:
        return None
    dataset = parts[1]
    if dataset not in datasets:
        return (f"{target}: the config has no dataset {dataset!r}; its datasets: {', '.join(datasets)}. Fix: name "
                f"one of them ({RESULTS}/<dataset>/…), or declare {dataset!r} under `datasets:` in the config")
    folders = sorted(set(folders))
    if len(parts) > 3 and parts[2] not in folders:
        return (f"{target}: no rule writes under {RESULTS}/{dataset}/{parts[2]}/; a dataset's results are in "
                f"{', '.join(f + '/' for f in folders)}. Fix: name one of those (docs/artifacts.md lists the files)")
    return None


_NO_RULE = re.compile(r"No rule to produce (\S+)")


def explain(error: BaseException | None, *, datasets: Iterable[str] = (),
            folders: Callable[[], Iterable[str]] = tuple, configfiles: Iterable[str] = (),
            folders_of_run: dict | None = None) -> str | None:
    """The message to show for ``error``, which stopped Snakemake before or while it built the job graph: the
    :class:`PipelineError` it is or wraps (Snakemake wraps one raised in an input function), why a target
    cannot be made (:func:`unknown_target`; ``folders()``: the folders rules write under a dataset's results), or
    why a dataset's raw files are missing (:func:`~dpr_pipeline.orchestration.run_folders.missing_raw_files`, given
    ``datasets`` as the config's mapping and ``folders_of_run``: ``workdir``, ``rundir`` and ``basedir``); None
    when the error is none of these."""
    from snakemake.exceptions import MissingInputException, MissingRuleException
    from snakemake_interface_common.exceptions import WorkflowError

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConfigError):
            files = ", ".join(str(f) for f in configfiles)
            return f"Error in the config{f' ({files})' if files else ''}:\n{error}"
        if isinstance(error, PipelineError):
            return job_error_line(error)
        if isinstance(error, MissingInputException):
            if folders_of_run is None or not isinstance(datasets, dict):
                return None
            return missing_raw_files(str(error), datasets, **folders_of_run)
        if isinstance(error, MissingRuleException):
            target = _NO_RULE.search(str(error))
            return unknown_target(target.group(1), datasets, folders()) if target else None
        if not isinstance(error, WorkflowError):
            return None
        error = error.__cause__ or error.__context__
    return None


class LastLines(logging.Filter):
    """On Snakemake's logger: the error Snakemake prints as it stops (a record carrying ``exception``, its class
    name) reads ``report`` when ``onerror`` set one (the failed jobs), else ``explain(the error)`` where that
    gives a message; every other record passes unchanged."""

    def __init__(self, explain: Callable[[BaseException | None], str | None]):
        super().__init__()
        self.explain = explain
        self.report: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and getattr(record, "exception", None):
            try:
                text = self.report or self.explain(sys.exc_info()[1])
            except Exception:       # never lose Snakemake's own message to a failure here
                text = None
            if text:
                record.msg, record.args = text, ()
        return True

    @classmethod
    def install(cls, logger: logging.Logger, explain: Callable[[BaseException | None], str | None]) -> "LastLines":
        """A new filter on ``logger``, replacing one installed before (a workflow read twice in one process)."""
        for old in [f for f in logger.filters if isinstance(f, cls)]:
            logger.removeFilter(old)
        last = cls(explain)
        logger.addFilter(last)
        return last
