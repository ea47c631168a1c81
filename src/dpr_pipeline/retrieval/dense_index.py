"""Faiss inner-product indexes over the encoded corpus shards (searched by :mod:`.dense_search`).

The vectors are unit length, so the inner product is the cosine. Index kinds:

* ``flat``: ``IndexFlatIP``, exact search (the default, and what the paper's numbers assume);
* ``hnsw``: ``IndexHNSWFlat`` with ``METRIC_INNER_PRODUCT`` (graph search; ``efSearch`` trades speed for recall);
* ``ivfpq``: ``IVF{lists},PQ{m}x{bits}np`` from ``index_factory`` with ``METRIC_INNER_PRODUCT``, trained on a
  seeded random sample of the vectors (``np``: no polysemous training, which only Hamming-filtered search
  uses and which is slow; ``nprobe`` trades speed for recall).

Row ``i`` of the index is the document in row ``i`` of the ids Parquet written next to it. Memory: a ``flat``
index holds ``4 * dim`` bytes per passage (MS MARCO, 8.8M x 768: 27 GB in host memory).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.data.schemas import open_parquet
from dpr_pipeline.errors import DataError

logger = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "hnsw", "ivfpq")
_ADD_CHUNK = 65536  # vectors upcast to float32 and added at a time
_REENCODE = "delete the shard's vectors and ids and rerun the encoding rule"
_REBUILD = "delete it and rerun the Snakemake rule that writes it"


def build_index(vector_files: Sequence[str | Path], id_files: Sequence[str | Path], output_index: str | Path,
                output_ids: str | Path, *, kind: str = "flat", hnsw_m: int = 32, ivf_lists: int | None = None,
                pq_subquantizers: int | None = None, pq_bits: int = 8, train_size: int = 300_000,
                seed: int = 0) -> None:
    """Index the shards' vectors (in the given order) and write the index and the concatenated ids atomically.

    ``ivf_lists`` defaults to ``4 sqrt(n)`` (at most ``n / 39``, faiss's minimum points per centroid) and
    ``pq_subquantizers`` to ``dim / 8``. Every shard's ids must match its vectors one to one, and no id may
    appear twice across the shards.
    """
    if kind not in INDEX_KINDS:
        raise ValueError(f"index kind {kind!r}: use one of {INDEX_KINDS}")
    if len(vector_files) != len(id_files) or not vector_files:
        raise ValueError(f"need one ids file per vectors file (got {len(vector_files)} and {len(id_files)})")
    shards = [_open_vectors(path) for path in vector_files]
    dim = _common_dim(shards, vector_files)
    ids = _check_ids(shards, vector_files, id_files)
    total = len(ids)
    index = _new_index(kind, dim, total, min(train_size, total), hnsw_m=hnsw_m, ivf_lists=ivf_lists,
                       pq_subquantizers=pq_subquantizers, pq_bits=pq_bits)
    if not index.is_trained:
        index.train(_training_sample(shards, train_size, seed))
    for path, vectors in zip(vector_files, shards):
        for start in range(0, len(vectors), _ADD_CHUNK):
            index.add(np.ascontiguousarray(vectors[start:start + _ADD_CHUNK], dtype=np.float32))
        logger.info("added %d vectors from %s (%d in the index)", len(vectors), path, index.ntotal)
    with atomic_outputs(output_index, output_ids) as (index_tmp, ids_tmp):
        faiss.write_index(index, str(index_tmp))
        pq.write_table(pa.table({"doc_id": ids}), ids_tmp)


def _open_vectors(path: str | Path) -> np.ndarray:
    """A shard's vectors, memory-mapped (read as they are added), checked to be a 2-D float array."""
    try:
        vectors = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise DataError(path, "the vectors file does not exist", "run the encoding rule that writes it") from None
    except (OSError, ValueError) as err:
        with open(path, "rb") as handle:
            header = handle.read(6)
        reason = "no NumPy header" if header != b"\x93NUMPY" else str(err)
        raise DataError(path, f"not a readable .npy file ({reason})", _REENCODE) from None
    if vectors.ndim != 2 or vectors.dtype not in (np.float16, np.float32):
        raise DataError(path, f"vectors of shape {vectors.shape} and dtype {vectors.dtype}, need a 2-D "
                        f"float16 or float32 array", _REENCODE)
    return vectors


def _common_dim(shards: list[np.ndarray], vector_files: Sequence[str | Path]) -> int:
    dim = shards[0].shape[1]
    for path, vectors in zip(vector_files, shards):
        if vectors.shape[1] != dim:
            raise DataError(path, f"vectors of dimension {vectors.shape[1]}, {vector_files[0]} has {dim}",
                            "encode every shard with the same model")
    return dim


def _check_ids(shards: list[np.ndarray], vector_files: Sequence[str | Path],
               id_files: Sequence[str | Path]) -> pa.ChunkedArray:
    """All shards' doc ids in index order, after checking counts and uniqueness across shards."""
    chunks = []
    for vectors_path, ids_path, vectors in zip(vector_files, id_files, shards):
        ids = read_index_ids(ids_path)
        if len(ids) != len(vectors):
            raise DataError(ids_path, f"{len(ids)} doc ids for the {len(vectors)} vectors of {vectors_path}",
                            _REENCODE)
        chunks.append(ids)
    ids = pa.chunked_array(chunks, type=pa.string())
    duplicated = pd.Series(ids.to_numpy()).duplicated()
    if duplicated.any():
        _raise_duplicate(ids, int(np.flatnonzero(duplicated.to_numpy())[0]), [len(c) for c in chunks], id_files)
    return ids


def read_index_ids(path: str | Path) -> pa.Array:
    """The doc ids of an index's rows (its ids Parquet, or one encoding shard's), as one string array."""
    table = open_parquet(path, "ids file", missing_fix="run the encoding rule that writes it",
                         corrupt_fix=_REENCODE).read()
    if "doc_id" not in table.column_names:
        raise DataError(path, f"no doc_id column (has {table.column_names})", _REENCODE)
    return table.column("doc_id").combine_chunks().cast(pa.string())


def _raise_duplicate(ids: pa.ChunkedArray, position: int, sizes: list[int],
                     id_files: Sequence[str | Path]) -> None:
    """Name the file and row of the repeated id and where it first appeared."""
    doc_id = ids[position].as_py()
    first = ids.to_pylist().index(doc_id)
    ends = np.cumsum(sizes)
    shard, first_shard = (int(np.searchsorted(ends, p, side="right")) for p in (position, first))
    row = position - (ends[shard] - sizes[shard]) + 1
    first_row = first - (ends[first_shard] - sizes[first_shard]) + 1
    raise DataError(id_files[shard], f"doc_id {doc_id!r} is also in {id_files[first_shard]} (row {first_row})",
                    "encode every shard of one corpus with the same num_shards, list each shard once, "
                    "and make doc ids unique in the corpus", row=int(row))


def _new_index(kind: str, dim: int, total: int, training_rows: int, *, hnsw_m: int, ivf_lists: int | None,
               pq_subquantizers: int | None, pq_bits: int) -> faiss.Index:
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        return faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    lists = ivf_lists or max(1, min(int(4 * math.sqrt(total)), total // 39))
    subquantizers = pq_subquantizers or max(1, dim // 8)
    if dim % subquantizers:
        raise ValueError(f"pq_subquantizers={subquantizers} must divide the vector dimension {dim}")
    if training_rows < max(lists, 2 ** pq_bits):
        raise ValueError(f"an IVF{lists},PQ{subquantizers}x{pq_bits} index needs at least "
                         f"{max(lists, 2 ** pq_bits)} training vectors, it has {training_rows} (of {total}): "
                         f"use kind='flat', a larger train_size or lower ivf_lists / pq_bits")
    logger.info("IVF-PQ index: %d lists, %d sub-quantizers of %d bits", lists, subquantizers, pq_bits)
    return faiss.index_factory(dim, f"IVF{lists},PQ{subquantizers}x{pq_bits}np",
                               faiss.METRIC_INNER_PRODUCT)


def _training_sample(shards: list[np.ndarray], train_size: int, seed: int) -> np.ndarray:
    """A seeded sample of at most ``train_size`` vectors drawn uniformly from all shards, as float32."""
    sizes = [len(v) for v in shards]
    total = sum(sizes)
    rows = np.sort(np.random.default_rng(seed).choice(total, size=min(train_size, total), replace=False))
    starts = np.cumsum([0] + sizes)
    parts = [np.asarray(vectors[rows[(rows >= lo) & (rows < hi)] - lo], dtype=np.float32)
             for vectors, lo, hi in zip(shards, starts[:-1], starts[1:])]
    return np.ascontiguousarray(np.concatenate(parts))
