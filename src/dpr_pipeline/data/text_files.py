"""Line-by-line reading of plain or gzipped text files with strict UTF-8 and line numbers for errors.

A UTF-8 byte-order mark (BOM, ``EF BB BF``, which Windows editors and Excel write) at the start of a file is
accepted and stripped in every text input (JSON lines, TSV, DPR's csv-style TSV and JSON), so it never ends up
in the first id or breaks the first JSON line."""

from __future__ import annotations

import csv
import gzip
import json
import logging
import zlib
from pathlib import Path
from typing import Iterator

from dpr_pipeline.errors import DataError

log = logging.getLogger(__name__)
BOM = "\ufeff"


def resolve_file(path: str | Path, what: str) -> Path:
    """``path`` itself or ``path.gz``, whichever exists (logged); a clear error when neither does, and when both
    do (the pipeline does not choose between two copies: one may be partial)."""
    path = Path(path)
    found = [c for c in (path, path.with_name(path.name + ".gz")) if c.is_file()]
    if len(found) > 1:
        raise ambiguous_files(what, found)
    if found:
        log.info("%s: reading %s", what, found[0])
        return found[0]
    raise DataError(path, f"{what} file not found (looked for {path.name} and {path.name}.gz)",
                    "check the dataset's `path` in config.yaml and that the file is there")


def ambiguous_files(what: str, found: list[Path]) -> DataError:
    """Two (or more) files that could each be ``what``: one error naming them all."""
    names = " and ".join(str(f) for f in found)
    others = "others" if len(found) > 2 else "other"
    return DataError(found[0], f"{len(found)} candidate {what} files, {names}; the pipeline does not choose one",
                     f"keep only the one to read in {found[0].parent} (delete or move the {others} out of the "
                     "dataset folder)")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` without the line ending (and without a BOM at the file's start); skips
    blank lines.

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
            if line.startswith(BOM):
                if number > 1:
                    raise bom_inside(path, number)
                line = line[len(BOM):]
            line = line.rstrip("\r\n")
            if line.strip():
                yield number, line


def bom_inside(path: Path, line: int) -> DataError:
    """A BOM that starts a later line: files joined with ``cat``, each saved with a BOM."""
    return DataError(path, "a byte-order mark (BOM, U+FEFF) starts this line, inside the file (files saved with a "
                     "BOM and then joined, e.g. with `cat`?)", "remove the BOM from the line, e.g. "
                     "`sed -i '1!s/^\\xEF\\xBB\\xBF//' FILE` (one at the very start of a file is accepted)",
                     line=line)


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
            # err.msg may end in "at" ("Unterminated string starting at"): one "at" before the column
            raise DataError(path, f"not valid JSON ({err.msg.removesuffix(' at')} at column {err.colno})",
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
        if first is not None and len(first[1].split("\t")) != len(columns):
            raise DataError(path, f"the first line ({first[1]!r}) is not the header line ({', '.join(columns)}: "
                            f"{len(columns)} tab-separated columns), and dropping it could drop a judgement",
                            f"start the file with the header line {chr(9).join(columns)!r} and separate every "
                            "line's columns with tabs", line=first[0])
        if first is not None and is_integer(first[1].split("\t")[-1]):
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


def open_text(path: Path):
    """A text handle (strict UTF-8, a BOM at the start skipped, newlines untranslated as the csv module wants) on a
    plain or gzipped file."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, "r", encoding="utf-8-sig", newline="")


def iter_csv_rows(path: Path, columns: tuple[str, ...], *, header: tuple[str, ...] | None = None
                  ) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, fields)`` of a tab-separated file read as DPR reads it (``csv.reader`` with
    ``delimiter="\\t"``: a field in double quotes may hold tabs, newlines and doubled quotes).

    ``header``: the first row must be exactly these names. ``line_number`` is the row's last physical line.
    """
    with open_text(path) as handle:
        reader = csv.reader(handle, delimiter="\t")
        try:
            if header is not None:
                first = next(reader, None)
                if first is None or [f.strip() for f in first] != list(header):
                    raise DataError(path, f"header {first!r}, expected {list(header)}",
                                    f"start the file with the tab-separated header line: {' '.join(header)}",
                                    line=1)
            for fields in reader:
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue
                if fields[0].startswith(BOM):
                    raise bom_inside(path, reader.line_num)
                if len(fields) != len(columns):
                    raise DataError(path, f"{len(fields)} tab-separated columns, expected {len(columns)} "
                                    f"({', '.join(columns)})",
                                    f"write {len(columns)} columns per line: {', '.join(columns)} (a field with "
                                    "a tab or a stray double quote must be quoted: \"...\" with \"\" inside)",
                                    line=reader.line_num)
                yield reader.line_num, fields
        except UnicodeDecodeError as err:
            raise DataError(path, f"bytes that are not UTF-8 ({err.reason})",
                            "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`",
                            line=reader.line_num + 1) from None
        except csv.Error as err:
            raise DataError(path, f"not a readable tab-separated line ({err})",
                            "close every double-quoted field", line=reader.line_num) from None
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise _gzip_error(path, err, reader.line_num + 1) from None


def iter_json_array(path: Path, chunk_chars: int = 1 << 20,
                    max_object_chars: int = 1 << 26) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each element of a (possibly huge) JSON array of objects, streaming:
    only the current object and one chunk are in memory. ``line_number`` is where the object starts.

    An element that does not parse is given more text until it does, the file ends, or it would exceed
    ``max_object_chars`` (so a syntax error early in a large file does not load the rest of it)."""
    with open_text(path) as handle:
        stream = _JsonArrayStream(path, handle, chunk_chars, max_object_chars)
        if stream.next_char() != "[":
            raise stream.fail("not a JSON array (the file must start with '[')")
        stream.pos += 1
        expect_element = True
        while True:
            char = stream.next_char()
            if char == "]" and expect_element is not None:
                stream.pos += 1
                if stream.next_char() != "":
                    raise stream.fail("text after the closing ']'")
                return
            if char == "":
                raise stream.fail("the file ends inside the array (truncated?)")
            if expect_element is False:
                if char != ",":
                    raise stream.fail(f"expected ',' or ']' between objects, found {char!r}")
                stream.pos += 1
                expect_element = None  # an element must follow a comma
                continue
            line, record = stream.line, stream.decode_element()
            if not isinstance(record, dict):
                raise stream.fail(f"an element is {type(record).__name__}, expected an object", line)
            yield line, record
            expect_element = False


class _JsonArrayStream:
    """The text of a JSON array file read in chunks: ``buffer[pos:]`` is what is not consumed yet, ``line`` the
    line at ``pos``."""

    def __init__(self, path: Path, handle, chunk_chars: int, max_object_chars: int):
        self.path, self.handle = path, handle
        self.chunk_chars, self.max_object_chars = chunk_chars, max_object_chars
        self.buffer, self.pos, self.line, self.eof = "", 0, 1, False
        self.decoder = json.JSONDecoder()

    def fail(self, problem: str, line: int | None = None) -> DataError:
        return DataError(self.path, problem, "give a JSON list of objects (DPR's biencoder-*.json layout)",
                         line=self.line if line is None else line)

    def read_more(self) -> bool:
        """Append the next chunk (dropping what is consumed); False at the end of the file."""
        try:
            chunk = self.handle.read(self.chunk_chars)
        except UnicodeDecodeError as err:
            raise DataError(self.path, f"bytes that are not UTF-8 ({err.reason})", "re-encode the file as UTF-8",
                            line=self.line) from None
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise _gzip_error(self.path, err, self.line) from None
        if not chunk:
            self.eof = True
            return False
        self.buffer, self.pos = self.buffer[self.pos:] + chunk, 0
        return True

    def next_char(self) -> str:
        """The next non-whitespace character (consumed whitespace counted in ``line``), '' at the end."""
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos] in " \t\r\n":
                self.line += self.buffer[self.pos] == "\n"
                self.pos += 1
            if self.pos < len(self.buffer):
                return self.buffer[self.pos]
            if not self.read_more():
                return ""

    def decode_element(self):
        """The JSON value at ``pos`` (reading more text while it is incomplete), consumed."""
        while True:
            try:
                record, end = self.decoder.raw_decode(self.buffer, self.pos)
                break
            except json.JSONDecodeError as err:
                if not self.eof and len(self.buffer) - self.pos < self.max_object_chars and self.read_more():
                    continue
                raise self.fail(f"not valid JSON ({err.msg})",
                                self.line + self.buffer.count("\n", self.pos, err.pos)) from None
        self.line += self.buffer.count("\n", self.pos, end)
        self.pos = end
        return record


def is_integer(text: str) -> bool:
    try:
        int(text.strip())
    except ValueError:
        return False
    return True


def dataset_folder(root: str | Path) -> Path:
    """``root`` as a Path; a dataset ``path`` that is a file, not the folder of the raw files, is a DataError
    (a missing folder is left to the per-file "not found" errors, which name the file looked for)."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise DataError(root, "the dataset's `path` is a file, not a folder",
                        f"set the dataset's `path` in config.yaml to the folder that holds the raw files (here "
                        f"probably {str(root.parent)!r}, the folder of {root.name!r})")
    return root
