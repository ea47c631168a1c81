"""The schema of every Parquet artifact, written in one place and checked whenever an artifact is read.

See docs/artifacts.md for the meaning of each column.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DataError
from ..io import atomic_output

SCHEMAS: dict[str, pa.Schema] = {
    "corpus": pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())]),
    "queries": pa.schema([("query_id", pa.string()), ("text", pa.string())]),
    "qrels": pa.schema([("query_id", pa.string()), ("doc_id", pa.string()), ("relevance", pa.int32())]),
    "negatives": pa.schema([
        ("query_id", pa.string()),
        ("positive_ids", pa.list_(pa.string())),
        ("positive_scores", pa.list_(pa.float32())),
        ("negative_ids", pa.list_(pa.string())),
        ("negative_scores", pa.list_(pa.float32())),
    ]),
    "answers": pa.schema([("query_id", pa.string()), ("answers", pa.list_(pa.string()))]),
}
# Columns that together identify a row: unique and never null or empty.
KEYS = {"corpus": ["doc_id"], "queries": ["query_id"], "qrels": ["query_id", "doc_id"],
        "negatives": ["query_id"], "answers": ["query_id"]}

_REBUILD = "delete it and rerun the Snakemake rule that writes it"


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Same kind of column: any string width, any integer width, any float width, lists of those."""
    if pa.types.is_list(expected) or pa.types.is_large_list(expected):
        return ((pa.types.is_list(actual) or pa.types.is_large_list(actual))
                and _compatible(actual.value_type, expected.value_type))
    for kind in (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), pa.types.is_integer,
                 pa.types.is_floating):
        if kind(expected):
            return kind(actual)
    return actual == expected


def check_schema(schema: pa.Schema, kind: str, path: str | Path) -> None:
    """Raise a DataError unless ``schema`` has every column of artifact ``kind`` with its type."""
    expected = SCHEMAS[kind]
    for field in expected:
        if field.name not in schema.names:
            raise DataError(path, f"missing column {field.name!r} of the {kind} artifact "
                            f"(has {schema.names})", _REBUILD)
        actual = schema.field(field.name).type
        if not _compatible(actual, field.type):
            raise DataError(path, f"column {field.name!r} is {actual}, the {kind} artifact needs "
                            f"{field.type}", _REBUILD)


def check_frame(frame: pd.DataFrame, kind: str, path: str | Path) -> None:
    """Raise a DataError naming the first bad row (1-based) of a frame that breaks artifact ``kind``."""
    for key in KEYS[kind]:
        values = frame[key]
        bad = values.isna() | (values.astype(str).str.strip() == "")
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0]) + 1
            raise DataError(path, f"empty {key}", _REBUILD, row=row)
    duplicated = frame.duplicated(KEYS[kind])
    if duplicated.any():
        row = int(duplicated.to_numpy().nonzero()[0][0]) + 1
        ids = ", ".join(str(frame[k].iloc[row - 1]) for k in KEYS[kind])
        raise DataError(path, f"duplicate {'/'.join(KEYS[kind])} ({ids})", _REBUILD, row=row)
    if kind == "negatives":
        for row, (ids, scores, nids, nscores) in enumerate(zip(frame["positive_ids"], frame["positive_scores"],
                                                               frame["negative_ids"], frame["negative_scores"]), 1):
            if len(ids) == 0:
                raise DataError(path, "a query without positives", _REBUILD, row=row)
            if len(ids) != len(scores) or len(nids) != len(nscores):
                raise DataError(path, "ids and scores of different lengths", _REBUILD, row=row)
    if kind == "answers":
        for row, answers in enumerate(frame["answers"], 1):
            if answers is None or len(answers) == 0:
                raise DataError(path, "a question without answers", _REBUILD, row=row)


def open_parquet(path: str | Path, what: str, *, missing_fix: str = "run the Snakemake rule that writes it",
                 corrupt_fix: str = _REBUILD) -> pq.ParquetFile:
    """A Parquet file opened (only its footer read), or one DataError naming it: missing, or not Parquet."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, f"the {what} does not exist", missing_fix)
    try:
        return pq.ParquetFile(path)
    except Exception as err:  # corrupt or not Parquet
        raise DataError(path, f"not a readable Parquet file ({err})", corrupt_fix) from None


def read_artifact(path: str | Path, kind: str, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a Parquet artifact after checking its schema (and, when all columns are read, its rows)."""
    parquet = open_parquet(path, f"{kind} artifact")
    check_schema(parquet.schema_arrow, kind, path)
    frame = parquet.read(columns=columns or SCHEMAS[kind].names).to_pandas()
    if columns is None or set(KEYS[kind]) <= set(columns):
        check_frame(frame, kind, path)
    return frame


def to_table(frame: pd.DataFrame, kind: str) -> pa.Table:
    return pa.Table.from_pandas(frame[SCHEMAS[kind].names], schema=SCHEMAS[kind], preserve_index=False)


def write_artifact(frame: pd.DataFrame, path: str | Path, kind: str, metadata: dict[str, str] | None = None) -> None:
    """Check ``frame`` against artifact ``kind`` and write it atomically (no partial file on error)."""
    check_frame(frame, kind, path)
    table = to_table(frame, kind)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               **{f"dpr_pipeline.{k}": v for k, v in metadata.items()}})
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp)
