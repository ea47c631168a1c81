"""Query and document ids must survive the whitespace-separated files the pipeline writes (TREC runs, TSV).

An id with a space, tab, newline or another control character would split a TREC run line into the wrong
columns (``7 whitespace-separated columns, expected 6``) or break it across lines, so such an id is refused where
it enters (ingestion, naming the raw file and line) and again by every writer of a run (naming the output).
"""

from __future__ import annotations

import unicodedata

_NAMES = {" ": "a space", "\t": "a tab", "\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}

ID_FIX = ("remove the whitespace or control characters from the id, or replace them (e.g. with '_'), "
          "in every file that names it (corpus, queries, qrels)")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be written as one column of a TREC run or TSV line, or None when it can."""
    for position, char in enumerate(value, start=1):
        if char.isspace() or unicodedata.category(char) == "Cc":
            name = _NAMES.get(char) or (f"whitespace U+{ord(char):04X}" if char.isspace()
                                       else f"the control character U+{ord(char):04X}")
            return f"contains {name} (character {position})"
    return None
