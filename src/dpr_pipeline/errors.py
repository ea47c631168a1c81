"""The one error type for bad input data: it names the file, the place in it, the problem and the fix."""

from __future__ import annotations

from os import PathLike


class DataError(ValueError):
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
