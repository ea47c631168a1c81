"""What the raw-file readers yield: one record per document, query, judgement, negatives line or question, each
with its :class:`Location` (file and line, or Parquet row) so a later check names where a bad record came from;
and the field checks every reader applies (a string, valid Unicode, an integer grade)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from dpr_pipeline.errors import DataError


class Location(NamedTuple):
    path: Path
    line: int | None = None
    row: int | None = None

    def error(self, problem: str, fix: str) -> DataError:
        return DataError(self.path, problem, fix, line=self.line, row=self.row)


class Document(NamedTuple):
    where: Location
    doc_id: str
    title: str
    text: str


class Query(NamedTuple):
    where: Location
    query_id: str
    text: str


class Judgement(NamedTuple):
    where: Location
    query_id: str
    doc_id: str
    relevance: int


class NegativeList(NamedTuple):
    where: Location
    query_id: str
    doc_ids: list[str]


class Question(NamedTuple):
    """A DPR question: its answers, and (bi-encoder JSON only) positive and BM25 hard-negative passage ids."""
    where: Location
    query_id: str
    text: str
    answers: list[str]
    positive_ids: list[str]
    hard_negative_ids: list[str]


_SURROGATE = re.compile("[\ud800-\udfff]")


def as_text(value, where: Location, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return check_unicode(str(value), where, field)
    raise where.error(f"field {field!r} is {type(value).__name__}, expected a string",
                      f"write {field!r} as a string")


def check_unicode(text: str, where: Location, field: str) -> str:
    """``text``, unless it holds a lone surrogate (a JSON ``\\ud800`` escape without its pair): no UTF-8 file
    (Parquet, the BM25 collection, a run) can store it, so it is refused here, with its file and line."""
    found = _SURROGATE.search(text)
    if found:
        raise where.error(f"field {field!r} holds the unpaired surrogate U+{ord(found.group()):04X} (character "
                          f"{found.start() + 1}), which is not text and cannot be written as UTF-8",
                          "repair or remove that escape (a \\uD800-\\uDFFF escape must come as a high-low "
                          "pair) and write the file as valid UTF-8")
    return text


def as_relevance(value: str, where: Location) -> int:
    try:
        return int(value)
    except ValueError:
        try:
            as_float = float(value)
        except ValueError:
            as_float = None
        if as_float is not None and as_float.is_integer():
            return int(as_float)
        raise where.error(f"relevance {value!r} is not an integer", "write relevance as an integer grade "
                          "(0 = not relevant, 1 or more = relevant)") from None


# --------------------------------------------------------------------------------------------- parquet
