"""A corpus's passage strings in one memory-mapped Arrow file, shared by every process of a node.

Training, re-ranking and teacher-scoring jobs look passages up by doc id. Read into a Python dict (with the
negatives as id strings), each process held ~1.2 KB per passage (benchmarks/training_groups_memory.py), ~10.7 GB
for MS MARCO's 8.8M, once per GPU process of a job.
The store (``data/passages.arrow``, rule ``passage_store``) is an uncompressed Arrow IPC file with the columns
``doc_id`` and ``passage`` (``title text``, the string every encoder reads:
:func:`~dpr_pipeline.data.corpus_shards.passage_text`)
in the corpus artifact's row order. :meth:`PassageStore.open` memory-maps it: its pages live in the operating
system's page cache, one copy for all processes of a node, and a process holds only the rows it asks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.corpus_shards import iter_corpus_rows, open_corpus, passage_text
from dpr_pipeline.data.schemas import map_arrow_file
from dpr_pipeline.errors import DataError

SCHEMA = pa.schema([("doc_id", pa.string()), ("passage", pa.large_string())])


def write_passage_store(corpus_path: str | Path, output_path: str | Path) -> int:
    """Write the store of a corpus artifact, one record batch per batch read (bounded memory); the row count."""
    corpus = open_corpus(corpus_path)
    rows = 0
    with atomic_output(output_path) as tmp, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as out:
        for batch in iter_corpus_rows(corpus, 0, corpus.metadata.num_rows):
            titles, texts = batch.column("title").to_pylist(), batch.column("text").to_pylist()
            passages = pa.array([passage_text(t, x or "") for t, x in zip(titles, texts)], pa.large_string())
            out.write_batch(pa.record_batch([batch.column("doc_id").cast(pa.string()), passages], schema=SCHEMA))
            rows += batch.num_rows
    return rows


class PassageStore:
    """Passage strings by row, and the rows of doc ids. :meth:`open` maps a store file; :meth:`of` builds one in
    memory (tests, a few passages)."""

    def __init__(self, table: pa.Table, source: str):
        if table.schema != SCHEMA:
            raise DataError(source, f"not a passage store (columns {table.schema.names})",
                            "delete it and rerun the passage_store rule")
        self.source = source
        self._doc_ids = table.column("doc_id").combine_chunks()   # the ids only: ~8 bytes a passage
        self._chunks = table.column("passage").chunks             # record batches that point into the mapped file
        self._chunk_starts = np.cumsum([0] + [len(chunk) for chunk in self._chunks])

    @classmethod
    def open(cls, path: str | Path) -> "PassageStore":
        table = map_arrow_file(path, "passage store", "run the passage_store rule that writes it",
                               "delete it and rerun the passage_store rule")
        return cls(table, str(path))

    @classmethod
    def of(cls, passages: Mapping[str, str]) -> "PassageStore":
        table = pa.table([pa.array(list(passages), pa.string()), pa.array(list(passages.values()), pa.large_string())],
                         schema=SCHEMA)
        return cls(table, "passages")

    def __len__(self) -> int:
        return len(self._doc_ids)

    def rows_of(self, doc_ids: pa.Array | Sequence[str]) -> np.ndarray:
        """The store row (int64) of each doc id; -1 for an id that is not in the corpus."""
        doc_ids = doc_ids if isinstance(doc_ids, pa.Array) else pa.array(doc_ids, pa.string())
        return pc.fill_null(pc.index_in(doc_ids, value_set=self._doc_ids), -1).to_numpy().astype(np.int64)

    def passages(self, rows: np.ndarray | Sequence[int]) -> list[str]:
        """The passage strings of ``rows`` (copied out of the mapped file), taken record batch by record batch:
        a ``take`` on the whole column joins its chunks first, a copy of the corpus per call."""
        rows = np.asarray(rows, dtype=np.int64)
        chunk_of = np.searchsorted(self._chunk_starts, rows, side="right") - 1
        order = np.argsort(chunk_of, kind="stable")
        chunks, firsts = np.unique(chunk_of[order], return_index=True)
        texts: list[str] = [""] * len(rows)
        for chunk, first, end in zip(chunks, firsts, [*firsts[1:], len(rows)]):
            positions = order[first:end]
            local = pa.array(rows[positions] - self._chunk_starts[chunk])
            for position, text in zip(positions, self._chunks[chunk].take(local).to_pylist()):
                texts[position] = text
        return texts

    def doc_ids(self, rows: np.ndarray | Sequence[int]) -> list[str]:
        return self._doc_ids.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()
