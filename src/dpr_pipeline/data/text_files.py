"""Line-by-line reading of plain or gzipped text files with strict UTF-8 and line numbers for errors."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Iterator

from ..errors import DataError


def resolve_file(path: str | Path, what: str) -> Path:
    """``path`` itself or, failing that, ``path.gz``; a clear error when neither exists."""
    path = Path(path)
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.is_file():
            return candidate
    raise DataError(path, f"{what} file not found (looked for {path.name} and {path.name}.gz)",
                    "check the dataset's `path` in config.yaml and that the file is there")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` without the line ending; skips blank lines.

    A ``.gz`` file that is not gzip, truncated or corrupt raises a DataError naming the line it broke at."""
    opener = gzip.open if path.suffix == ".gz" else open
    number = 0
    with opener(path, "rb") as handle:
        while True:
            try:
                raw = handle.readline()
            except (EOFError, gzip.BadGzipFile, zlib.error) as err:
                raise _gzip_error(path, err, number + 1) from None
            if not raw:
                return
            number += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(path, f"bytes that are not UTF-8 ({err.reason} at byte {err.start})",
                                "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`",
                                line=number) from None
            line = line.rstrip("\r\n")
            if line.strip():
                yield number, line


def _gzip_error(path: Path, err: Exception, line: int) -> DataError:
    """A .gz file that is not gzip (``BadGzipFile``), cut short (``EOFError``) or corrupt (``zlib.error``)."""
    if isinstance(err, gzip.BadGzipFile) and str(err).startswith("Not a gzipped file"):
        return DataError(path, f"named .gz but not gzip-compressed ({err})",
                         "rename it without .gz, or compress it with `gzip`", line=line)
    problem = "the gzip stream ends early (truncated file)" if isinstance(err, EOFError) else \
        f"corrupt gzip data ({err})"
    return DataError(path, f"{problem}, after {line - 1} complete line(s)",
                     "download or copy the file again completely (`gzip -t` checks it)", line=line)


def iter_json_lines(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for a JSON-lines file whose objects must have ``required`` keys."""
    for number, line in iter_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(path, f"not valid JSON ({err.msg} at column {err.colno})",
                            "write one complete JSON object per line", line=number) from None
        if not isinstance(record, dict):
            raise DataError(path, "the line is JSON but not an object", "write one JSON object per line",
                            line=number)
        missing = [key for key in required if key not in record]
        if missing:
            raise DataError(path, f"missing field(s) {', '.join(map(repr, missing))}",
                            f"give every line the fields {', '.join(map(repr, required))}", line=number)
        yield number, record


def iter_tsv(path: Path, columns: tuple[str, ...], *, header: bool = False,
             whitespace: bool = False) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, fields)`` for a tab-separated file with exactly ``len(columns)`` fields.

    ``whitespace=True`` splits on any run of whitespace instead (TREC qrels use spaces or tabs).
    """
    lines = iter_lines(path)
    if header:
        first = next(lines, None)
        if first is not None and _is_integer(first[1].split("\t")[-1]):
            raise DataError(path, f"the first line ({first[1]!r}) is data, not the header line "
                            f"({', '.join(columns)})", f"add the header line {chr(9).join(columns)!r} "
                            "(this file type starts with one; without it the first line would be dropped)",
                            line=first[0])
    for number, line in lines:
        fields = line.split() if whitespace else line.split("\t")
        if len(fields) != len(columns):
            separator = "whitespace" if whitespace else "tab"
            raise DataError(path, f"{len(fields)} {separator}-separated columns, expected {len(columns)} "
                            f"({', '.join(columns)})",
                            f"write {len(columns)} columns per line: {', '.join(columns)}", line=number)
        yield number, fields


def _is_integer(text: str) -> bool:
    try:
        int(text.strip())
    except ValueError:
        return False
    return True
