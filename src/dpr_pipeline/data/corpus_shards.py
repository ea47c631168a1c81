"""Reading the corpus artifact in contiguous shards, so a job's memory is bounded by its shard.

Encoding, tokenization and teacher scoring split ``corpus.parquet`` into ``num_shards`` near-equal row ranges
(:func:`corpus_shard_bounds`); a shard job streams only the row groups that overlap its range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from dpr_pipeline.data.schemas import check_schema, open_parquet
from dpr_pipeline.errors import DataError

_READ_BATCH = 4096  # Parquet rows per streamed record batch
_REBUILD = "delete it and rerun the Snakemake rule that writes it"


def passage_text(title: str | None, text: str) -> str:
    """One string per passage: ``title text`` (the BEIR convention), or the text alone without a title."""
    return f"{title} {text}" if title else text


def corpus_shard_bounds(num_rows: int, shard: int, num_shards: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``shard`` (0-based) of ``num_shards`` contiguous, near-equal shards."""
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} of {num_shards}: need num_shards >= 1 and 0 <= shard < num_shards")
    return shard * num_rows // num_shards, (shard + 1) * num_rows // num_shards


def open_corpus(path: str | Path) -> pq.ParquetFile:
    """The corpus artifact as a ParquetFile (nothing read but the footer), its schema checked."""
    corpus = open_parquet(path, "corpus artifact")
    check_schema(corpus.schema_arrow, "corpus", path)
    return corpus


def read_corpus_rows(corpus: pq.ParquetFile, path: Path, start: int, stop: int) -> tuple[list[str], list[str]]:
    """Doc ids and passage strings (``title text``) of rows ``[start, stop)``; an empty doc_id is an error."""
    doc_ids: list[str] = []
    passages: list[str] = []
    for batch in iter_corpus_rows(corpus, start, stop):
        for doc_id, title, text in zip(*(batch.column(name).to_pylist() for name in ("doc_id", "title", "text"))):
            if not doc_id or not doc_id.strip():
                raise DataError(path, "empty doc_id", _REBUILD, row=start + len(doc_ids) + 1)
            doc_ids.append(doc_id)
            passages.append(passage_text(title, text or ""))
    return doc_ids, passages


def iter_corpus_rows(corpus: pq.ParquetFile, start: int, stop: int) -> Iterator[pa.RecordBatch]:
    """Stream rows ``[start, stop)``: only the row groups that overlap them are read, batch by batch."""
    groups, first_row = [], None
    row = 0
    for index in range(corpus.metadata.num_row_groups):
        size = corpus.metadata.row_group(index).num_rows
        if row < stop and row + size > start:
            groups.append(index)
            first_row = row if first_row is None else first_row
        row += size
    if not groups:
        return
    position = first_row
    for batch in corpus.iter_batches(batch_size=_READ_BATCH, row_groups=groups,
                                     columns=["doc_id", "title", "text"]):
        low, high = max(start - position, 0), min(stop - position, batch.num_rows)
        if low < high:
            yield batch.slice(low, high - low)
        position += batch.num_rows
        if position >= stop:
            return
