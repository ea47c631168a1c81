"""DPR's open-domain QA files (Natural Questions, TriviaQA, ...): ``psgs_w100.tsv`` (header ``id text title``,
read like DPR with ``csv`` and a tab delimiter), bi-encoder JSON (``biencoder-nq-train.json``: questions with
answers, ``positive_ctxs`` and ``hard_negative_ctxs``) and QA files (``nq-test.qa.csv``: ``question<TAB>[answers]``).
A question's id is its 0-based position in its file (Pyserini's ids for DPR topics). The parsing of the ``dpr``
format; which files it reads is :class:`.readers.DprFormat`'s."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Iterator

from dpr_pipeline.data.records import Document, Location, Question, as_text, check_unicode
from dpr_pipeline.data.text_files import iter_csv_rows, iter_json_array
from dpr_pipeline.errors import DataError


def read_dpr_passages(path: Path) -> Iterator[Document]:
    """The passages of ``psgs_w100.tsv`` (header ``id text title``)."""
    for line, (pid, text, title) in iter_csv_rows(path, ("id", "text", "title"), header=("id", "text", "title")):
        yield Document(Location(path, line), pid, title, text)


def _as_answers(value, where: Location) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise where.error(f"answers {value!r} are not a non-empty list of strings",
                          'give every question its answers as a list of strings, e.g. ["Paris", "Paris, France"]')
    if not any(a.strip() for a in value):
        raise where.error("every answer is empty", "give the question at least one non-empty answer")
    return [check_unicode(a, where, "answers") for a in value]


def _ctx_ids(record: dict, key: str, where: Location) -> list[str]:
    contexts = record.get(key) or []
    if not isinstance(contexts, list):
        raise where.error(f"{key!r} is {type(contexts).__name__}, expected a list of contexts",
                          f"write {key!r} as a list of {{title, text, passage_id}} objects")
    ids = []
    for number, ctx in enumerate(contexts, start=1):
        pid = ctx.get("passage_id", ctx.get("psg_id")) if isinstance(ctx, dict) else None
        if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
            raise where.error(f"context {number} of {key!r} has no passage id ('passage_id' or 'psg_id')",
                              "give every context the psgs_w100.tsv id of its passage (DPR's passage_id)")
        if str(pid).strip() not in ids:
            ids.append(str(pid).strip())
    return ids


def read_dpr_questions(path: str | Path) -> Iterator[Question]:
    """The questions of a DPR split file: bi-encoder JSON (``.json``) or QA file (``.qa.csv``/``.csv``)."""
    path = Path(path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith(".json"):
        for index, (line, record) in enumerate(iter_json_array(path)):
            where = Location(path, line)
            missing = [k for k in ("question", "answers") if k not in record]
            if missing:
                raise where.error(f"question record {index} lacks {', '.join(map(repr, missing))}",
                                  "give every record DPR's fields question, answers, positive_ctxs, "
                                  "hard_negative_ctxs")
            yield Question(where, str(index), as_text(record["question"], where, "question"),
                           _as_answers(record["answers"], where), _ctx_ids(record, "positive_ctxs", where),
                           _ctx_ids(record, "hard_negative_ctxs", where))
    elif name.endswith(".csv"):
        for index, (line, (question, answers)) in enumerate(iter_csv_rows(path, ("question", "answers"))):
            where = Location(path, line)
            try:
                parsed = json.loads(answers)
            except json.JSONDecodeError:
                try:
                    parsed = ast.literal_eval(answers.strip())
                except (ValueError, SyntaxError):
                    raise where.error(f"answers {answers[:80]!r} are not a list literal",
                                      'write the answers as a list, e.g. ["Paris", "Paris, France"]') from None
            yield Question(where, str(index), question, _as_answers(parsed, where), [], [])
    else:
        raise DataError(path, "not a DPR split file (expected .json or .qa.csv, optionally .gz)",
                        "name the split's file in the dataset's split_files")
