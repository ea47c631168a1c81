"""Faiss inner-product indexes over the encoded corpus shards, and dense retrieval with them.

The vectors are unit length, so the inner product is the cosine. Index kinds:

* ``flat``: ``IndexFlatIP``, exact search (the default, and what the paper's numbers assume);
* ``hnsw``: ``IndexHNSWFlat`` with ``METRIC_INNER_PRODUCT`` (graph search; ``efSearch`` trades speed for recall);
* ``ivfpq``: ``IVF{lists},PQ{m}x{bits}np`` from ``index_factory`` with ``METRIC_INNER_PRODUCT``, trained on a
  seeded random sample of the vectors (``np``: no polysemous training, which only Hamming-filtered search
  uses and which is slow; ``nprobe`` trades speed for recall).

Row ``i`` of the index is the document in row ``i`` of the ids Parquet written next to it.

Search runs on the GPUs when faiss-gpu is installed and a GPU is visible (``faiss.get_num_gpus()``), with the
index sharded over all visible GPUs in float32 (the same hits and scores as on the CPU, up to float rounding of
near-ties); otherwise, and for HNSW (no GPU version), on the CPU with faiss-cpu. Memory: a ``flat`` index holds
``4 * dim`` bytes per passage (MS MARCO, 8.8M x 768: 27 GB in host memory, split over the GPUs when searching there).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Iterator, Sequence

import faiss
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .data.schemas import open_parquet
from .encode import encode_queries
from .errors import DataError
from .io import atomic_outputs
from .runs import write_trec_run

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
        ids = _read_ids(ids_path)
        if len(ids) != len(vectors):
            raise DataError(ids_path, f"{len(ids)} doc ids for the {len(vectors)} vectors of {vectors_path}",
                            _REENCODE)
        chunks.append(ids)
    ids = pa.chunked_array(chunks, type=pa.string())
    duplicated = pd.Series(ids.to_numpy()).duplicated()
    if duplicated.any():
        _raise_duplicate(ids, int(np.flatnonzero(duplicated.to_numpy())[0]), [len(c) for c in chunks], id_files)
    return ids


def _read_ids(path: str | Path) -> pa.Array:
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


def search_index(index_path: str | Path, ids_path: str | Path, query_ids: Sequence[str],
                 query_vectors: np.ndarray, *, depth: int, batch_size: int = 1024,
                 hnsw_ef_search: int | None = None, ivf_nprobe: int | None = None,
                 use_gpu: bool | None = None) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Yield ``(query_id, [(doc_id, score), ...])`` for each query, hits in rank order (best first).

    A query gets fewer than ``depth`` hits only when the index holds fewer vectors (or an approximate
    index finds fewer). ``hnsw_ef_search`` / ``ivf_nprobe`` tune the approximate kinds. ``use_gpu``: None
    (default) searches on the GPUs when :func:`gpus_available`, True insists on it, False stays on the CPU.
    """
    if depth < 1 or batch_size < 1:
        raise ValueError(f"depth ({depth}) and batch_size ({batch_size}) must be >= 1")
    if len(query_ids) != len(query_vectors):
        raise ValueError(f"{len(query_ids)} query ids for {len(query_vectors)} query vectors")
    index = _read_index(index_path)
    doc_ids = np.asarray(_read_ids(ids_path).to_pylist(), dtype=object)
    if len(doc_ids) != index.ntotal:
        raise DataError(ids_path, f"{len(doc_ids)} doc ids for the {index.ntotal} vectors of {index_path}",
                        _REBUILD)
    if len(query_vectors) and query_vectors.shape[1] != index.d:
        raise DataError(index_path, f"the index has dimension {index.d}, the queries {query_vectors.shape[1]}",
                        "search with the model that encoded the corpus")
    _set_search_parameters(index, hnsw_ef_search, ivf_nprobe)
    index = _search_device(index, use_gpu)
    for start in range(0, len(query_ids), batch_size):
        batch = np.ascontiguousarray(query_vectors[start:start + batch_size], dtype=np.float32)
        scores, rows = index.search(batch, depth)
        for query_id, query_scores, query_rows in zip(query_ids[start:start + batch_size], scores, rows):
            found = query_rows >= 0
            yield query_id, list(zip(doc_ids[query_rows[found]].tolist(), query_scores[found].tolist()))


def gpus_available() -> int:
    """GPUs faiss can search on: 0 without faiss-gpu (faiss-cpu has no GPU code) or without a visible GPU."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def _search_device(index: faiss.Index, use_gpu: bool | None) -> faiss.Index:
    """The index itself (CPU), or a copy sharded over every visible GPU (flat and IVF kinds)."""
    gpus = gpus_available()
    if use_gpu is False or (use_gpu is None and gpus == 0):
        return index
    if gpus == 0:
        raise RuntimeError("use_gpu=True but faiss sees no GPU (install faiss-gpu and run where a GPU is visible)")
    if isinstance(index, faiss.IndexHNSW):
        logger.info("HNSW has no GPU version: searching on the CPU")
        return index
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True            # each GPU holds 1/n of the vectors
    options.useFloat16 = False      # float32 as on the CPU: the same scores
    logger.info("searching on %d GPU(s) (faiss-gpu)", gpus)
    return faiss.index_cpu_to_all_gpus(index, co=options)


def _read_index(path: str | Path) -> faiss.Index:
    if not Path(path).is_file():
        raise DataError(path, "the index does not exist", "run the Snakemake rule that builds it")
    try:
        return faiss.read_index(str(path))
    except RuntimeError as err:
        raise DataError(path, f"not a readable faiss index ({err})", _REBUILD) from None


def _set_search_parameters(index: faiss.Index, hnsw_ef_search: int | None, ivf_nprobe: int | None) -> None:
    if hnsw_ef_search is not None:
        if not isinstance(index, faiss.IndexHNSW):
            raise ValueError(f"hnsw_ef_search is set but the index is a {type(index).__name__}")
        index.hnsw.efSearch = hnsw_ef_search
    if ivf_nprobe is not None:
        try:
            faiss.extract_index_ivf(index).nprobe = ivf_nprobe
        except RuntimeError:
            raise ValueError(f"ivf_nprobe is set but the index is a {type(index).__name__}") from None


def dense_search(model_path: str, index_path: str | Path, ids_path: str | Path, queries_parquet: str | Path,
                 output_run: str | Path, *, depth: int, query_max_length: int, batch_size: int, tag: str,
                 search_batch_size: int = 1024, hnsw_ef_search: int | None = None,
                 ivf_nprobe: int | None = None, bf16: bool = False) -> None:
    """Encode the queries (``batch_size`` at a time), search the index and write a TREC run atomically."""
    query_ids, vectors = encode_queries(model_path, queries_parquet, max_length=query_max_length,
                                        batch_size=batch_size, bf16=bf16)
    logger.info("searching %s for %d queries (depth %d)", index_path, len(query_ids), depth)
    hits = search_index(index_path, ids_path, query_ids, vectors, depth=depth, batch_size=search_batch_size,
                        hnsw_ef_search=hnsw_ef_search, ivf_nprobe=ivf_nprobe)
    write_trec_run(hits, output_run, tag)
