"""The schema of every Parquet artifact, written in one place and checked whenever an artifact is read.

See docs/artifacts.md for the meaning of each column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.errors import DataError

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


def check_keys(frame: pd.DataFrame, keys: list[str], path: str | Path, first_row: int = 1) -> None:
    """Raise a DataError naming the first row whose ``keys`` are empty or repeat an earlier row's (``first_row``:
    the file row of the frame's first)."""
    for key in keys:
        values = frame[key]
        bad = values.isna() | (values.astype(str).str.strip() == "")
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise DataError(path, f"empty {key}", _REBUILD, row=row + first_row)
    duplicated = frame.duplicated(keys)
    if duplicated.any():
        row = int(duplicated.to_numpy().nonzero()[0][0])
        ids = ", ".join(str(frame[k].iloc[row]) for k in keys)
        raise DataError(path, f"duplicate {'/'.join(keys)} ({ids})", _REBUILD, row=row + first_row)


def check_frame(frame: pd.DataFrame, kind: str, path: str | Path, first_row: int = 1) -> None:
    """Raise a DataError naming the first bad row of a frame that breaks artifact ``kind`` (``first_row``: the
    file row of the frame's first)."""
    check_keys(frame, KEYS[kind], path, first_row)
    if kind == "negatives":
        for row, (ids, scores, nids, nscores) in enumerate(zip(frame["positive_ids"], frame["positive_scores"],
                                                               frame["negative_ids"], frame["negative_scores"]),
                                                           first_row):
            if len(ids) == 0:
                raise DataError(path, "a query without positives", _REBUILD, row=row)
            if len(ids) != len(scores) or len(nids) != len(nscores):
                raise DataError(path, "ids and scores of different lengths", _REBUILD, row=row)
    if kind == "answers":
        for row, answers in enumerate(frame["answers"], first_row):
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


def map_arrow_file(path: str | Path, what: str, missing_fix: str, corrupt_fix: str) -> pa.Table:
    """An uncompressed Arrow IPC file memory-mapped (its columns point into the file: nothing is read until used),
    or one DataError naming it: missing, or not Arrow."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, f"the {what} does not exist", missing_fix)
    try:
        return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except pa.ArrowInvalid as err:
        raise DataError(path, f"not a readable Arrow file ({err})", corrupt_fix) from None


def read_artifact(path: str | Path, kind: str, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a Parquet artifact after checking its schema (and, when all columns are read, its rows)."""
    parquet = open_parquet(path, f"{kind} artifact")
    check_schema(parquet.schema_arrow, kind, path)
    frame = parquet.read(columns=columns or SCHEMAS[kind].names).to_pandas()
    if columns is None or set(KEYS[kind]) <= set(columns):
        check_frame(frame, kind, path)
    return frame


def _first_row(bad: np.ndarray) -> int | None:
    """The first row (1-based) where ``bad`` holds, or None."""
    rows = np.flatnonzero(bad)
    return int(rows[0]) + 1 if len(rows) else None


def read_negatives_table(path: str | Path, rows: slice | None = None) -> pa.Table:
    """A negatives artifact as an Arrow table, checked as :func:`check_frame` checks it, without a Python object
    per id: MS MARCO's mined negatives hold ~10⁸ ids, ~6 GB as a DataFrame of strings. ``rows``: only those rows
    (a contiguous slice), reading only the row groups that hold them; their errors name the file's row."""
    parquet = open_parquet(path, "negatives artifact")
    check_schema(parquet.schema_arrow, "negatives", path)
    columns = SCHEMAS["negatives"].names
    first = 0
    if rows is None:
        table = parquet.read(columns=columns)
    else:
        starts = np.cumsum([0] + [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)])
        groups = [i for i in range(parquet.num_row_groups) if starts[i] < rows.stop and starts[i + 1] > rows.start]
        table = parquet.read_row_groups(groups, columns=columns).slice(rows.start - int(starts[groups[0]]),
                                                                         rows.stop - rows.start) \
            if groups else SCHEMAS["negatives"].empty_table()
        first = rows.start
    table = table.cast(SCHEMAS["negatives"])
    check_keys(table.select(KEYS["negatives"]).to_pandas(), KEYS["negatives"], path)
    length = {name: pc.fill_null(pc.list_value_length(table.column(name)), 0).to_numpy()
              for name in ("positive_ids", "positive_scores", "negative_ids", "negative_scores")}
    problems = [(_first_row(length["positive_ids"] == 0), "a query without positives"),
                (_first_row((length["positive_ids"] != length["positive_scores"])
                       | (length["negative_ids"] != length["negative_scores"])), "ids and scores of different lengths")]
    row, problem = min(((row, problem) for row, problem in problems if row is not None), default=(None, None))
    if row is not None:
        raise DataError(path, problem, _REBUILD, row=row + first)
    return table


def to_table(frame: pd.DataFrame, kind: str) -> pa.Table:
    return pa.Table.from_pandas(frame[SCHEMAS[kind].names], schema=SCHEMAS[kind], preserve_index=False)


def _with_metadata(schema: pa.Schema, metadata: dict[str, str] | None) -> pa.Schema:
    if not metadata:
        return schema
    return schema.with_metadata({**(schema.metadata or {}), **{f"dpr_pipeline.{k}": v for k, v in metadata.items()}})


#: Queries per row group of a negatives artifact: a sharded job (denoising or teacher scores) reads only the groups
#: holding its slice (MS MARCO: 502,939 queries, 123 groups; a slice of 1/64, ~7,900 rows, reads 2–3 of them).
NEGATIVES_ROW_GROUP = 4096


def write_artifact(frame: pd.DataFrame, path: str | Path, kind: str, metadata: dict[str, str] | None = None,
                   row_group_size: int | None = None) -> None:
    """Check ``frame`` against artifact ``kind`` and write it atomically (no partial file on error), in row groups
    of ``row_group_size`` rows (None: :data:`NEGATIVES_ROW_GROUP` for negatives, else pyarrow's default, 1M)."""
    check_frame(frame, kind, path)
    table = to_table(frame, kind)
    table = table.replace_schema_metadata(_with_metadata(table.schema, metadata).metadata)
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_size
                       or (NEGATIVES_ROW_GROUP if kind == "negatives" else None))


def write_artifact_batches(frames: Iterable[pd.DataFrame], path: str | Path, kind: str,
                           metadata: dict[str, str] | None = None) -> int:
    """Check each frame against artifact ``kind`` (keys unique across frames too) and write them as one file, one
    row group per frame, atomically (an error raised by ``frames`` leaves no file); the row count. Memory: one
    frame and the keys seen so far, whatever the file's size."""
    seen: set = set()
    rows = 0
    with atomic_output(path) as tmp, pq.ParquetWriter(tmp, _with_metadata(SCHEMAS[kind], metadata)) as writer:
        for frame in frames:
            check_frame(frame, kind, path, first_row=rows + 1)
            keys = list(zip(*(frame[key] for key in KEYS[kind])))
            repeated = next((i for i, key in enumerate(keys) if key in seen), None)
            if repeated is not None:
                raise DataError(path, f"duplicate {'/'.join(KEYS[kind])} ({', '.join(map(str, keys[repeated]))})",
                                _REBUILD, row=rows + repeated + 1)
            seen.update(keys)
            writer.write_table(to_table(frame, kind).replace_schema_metadata(writer.schema.metadata))
            rows += len(frame)
    return rows
