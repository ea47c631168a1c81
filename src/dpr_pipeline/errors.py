"""The error types: bad input data (DataError), unusable checkpoints, outputs that cannot be written; each names
the file, the problem and the fix. Each is a :class:`PipelineError`, as is :class:`ConfigError`: what a job or
the workflow reports as the message alone, its traceback kept in the job's log (``orchestration.job_log.logged``,
``run_errors``)."""

from __future__ import annotations

from os import PathLike
from pathlib import Path


class PipelineError(Exception):
    """An error in the user's data, config or files, or a job stopped on request (not a bug): ``str(error)`` is the
    whole message, naming the file (or config key), the line or row where there is one, the problem and the fix."""


class ConfigError(PipelineError, ValueError):
    """The configuration breaks the schema, or a setting cannot work where the job runs; the message names the key."""


class DataError(PipelineError, ValueError):
    """Bad input data. ``str(error)`` reads ``<file>, <where>: <problem>. Fix: <fix>``."""

    def __init__(self, path: str | PathLike, problem: str, fix: str, *, line: int | None = None,
                 row: int | None = None):
        self.path = str(path)
        self.line = line
        self.row = row
        self.problem = problem
        self.fix = fix
        where = f"line {line}" if line is not None else f"row {row}" if row is not None else None
        location = f"{self.path}, {where}" if where else self.path
        super().__init__(f"{location}: {problem}. Fix: {fix}")


class CheckpointError(PipelineError, RuntimeError):
    """A training checkpoint that cannot be used. ``str(error)`` names the file, the problem and the fix."""

    FIX = "delete the checkpoint folder {folder} to restart this stage's training from the beginning"

    def __init__(self, path: str | PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        folder = Path(path).parent.parent          # <checkpoint_dir>/latest/state.pt
        self.fix = self.FIX.format(folder=folder)
        super().__init__(f"{self.path}: {problem}. Fix: {self.fix}")


class OutputWriteError(PipelineError, OSError):
    """An output that could not be written (disk full, file-size limit, no permission, read-only, not a folder).

    ``str(error)`` names the output, the cause and the fix; no partial output is left behind.
    """

    def __init__(self, path: str | PathLike, errno_code: int, cause: str, fix: str):
        self.path = str(path)
        self.cause = cause
        self.fix = fix
        super().__init__(errno_code, f"cannot write {self.path}: {cause}. Fix: {fix}")

    def __str__(self) -> str:
        return self.strerror


class FetchError(DataError):
    """A download that failed or does not match its checksum. ``str(error)``: ``<file>: <problem>. Fix: <fix>``."""
