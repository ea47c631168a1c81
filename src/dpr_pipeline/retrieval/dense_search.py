"""Dense retrieval: encode the queries, search a faiss index of :mod:`.dense_index`, write a TREC run.

Search runs on the GPUs when faiss-gpu is installed and a GPU is visible (``faiss.get_num_gpus()``), with the
index sharded over all visible GPUs in float32 (the same hits and scores as on the CPU, up to float rounding of
near-ties); otherwise, and for HNSW (no GPU version), on the CPU with faiss-cpu.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator, Sequence

import faiss
import numpy as np

from dpr_pipeline.data.trec_runs import rank_order, write_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.retrieval.dense_index import read_index_ids
from dpr_pipeline.retrieval.encode import encode_queries

logger = logging.getLogger(__name__)

_REBUILD = "delete it and rerun the Snakemake rule that writes it"


def search_index(index_path: str | Path, ids_path: str | Path, query_ids: Sequence[str],
                 query_vectors: np.ndarray, *, depth: int, batch_size: int = 1024,
                 hnsw_ef_search: int | None = None, ivf_nprobe: int | None = None,
                 use_gpu: bool | None = None) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Yield ``(query_id, [(doc_id, score), ...])`` for each query, hits in rank order (best first; equal scores
    by doc id, :func:`~dpr_pipeline.data.trec_runs.rank_order`, also where a tie straddles ``depth``:
    :func:`_search_past_ties`).

    A query gets fewer than ``depth`` hits only when the index holds fewer vectors (or an approximate
    index finds fewer). ``hnsw_ef_search`` / ``ivf_nprobe`` tune the approximate kinds. ``use_gpu``: None
    (default) searches on the GPUs when :func:`gpus_available`, True insists on it, False stays on the CPU.
    """
    if depth < 1 or batch_size < 1:
        raise ValueError(f"depth ({depth}) and batch_size ({batch_size}) must be >= 1")
    if len(query_ids) != len(query_vectors):
        raise ValueError(f"{len(query_ids)} query ids for {len(query_vectors)} query vectors")
    index = _read_index(index_path)
    doc_ids = np.asarray(read_index_ids(ids_path).to_pylist(), dtype=object)
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
        scores, rows = _search_past_ties(index, batch, depth)
        for query_id, query_scores, query_rows in zip(query_ids[start:start + batch_size], scores, rows):
            found = query_rows >= 0
            hits = rank_order(zip(doc_ids[query_rows[found]].tolist(), query_scores[found].tolist()))
            yield query_id, hits[:depth]


def _search_past_ties(index: faiss.Index, batch: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """``index.search`` deep enough that every hit scoring exactly the ``depth``-th score is among the results.

    Which of several equal-scored vectors faiss returns at the cut is its own (device-dependent) choice; searching
    one hit deeper shows whether a tie crosses the cut, and the search goes deeper (doubling) until no returned
    query's last hit still equals its ``depth``-th score. The caller orders the ties by doc id and cuts at
    ``depth``. Exact ties are rare outside duplicate passages, so this usually costs one extra hit per query.
    """
    k = min(depth + 1, index.ntotal) if index.ntotal else depth
    while True:
        scores, rows = index.search(batch, k)
        if k <= depth or k >= index.ntotal:
            return scores, rows
        straddles = (rows[:, -1] >= 0) & (scores[:, -1] == scores[:, depth - 1])
        if not straddles.any():
            return scores, rows
        k = min(2 * k, index.ntotal)


def _cuda_gpus() -> int:
    """CUDA GPUs visible to PyTorch (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_available() -> int:
    """GPUs faiss can search on: 0 without faiss-gpu (faiss-cpu has no GPU code) or without a visible GPU."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def cpu_search_note(cuda_gpus: int, faiss_gpus: int) -> str | None:
    """The log line of a search that stays on the CPU although CUDA sees ``cuda_gpus`` GPUs, because this faiss
    (``faiss_gpus``: the GPUs it can use) is the CPU build; None where there is nothing to say."""
    if cuda_gpus == 0 or faiss_gpus > 0:
        return None
    return (f"searching on the CPU: {cuda_gpus} CUDA GPU(s) visible, but this faiss ({faiss.__version__}) has no GPU "
            "support. Install faiss's GPU build to search on them: the project's `gpu` extra (docs/cluster.md, "
            "'Software')")


def _search_device(index: faiss.Index, use_gpu: bool | None) -> faiss.Index:
    """The index itself (CPU), or a copy sharded over every visible GPU (flat and IVF kinds)."""
    gpus = gpus_available()
    if use_gpu is False or (use_gpu is None and gpus == 0):
        if use_gpu is None and (note := cpu_search_note(_cuda_gpus(), gpus)):
            logger.warning(note)
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
                 output_run: str | Path, *, depth: int, query_max_length: int | None, batch_size: int, tag: str,
                 search_batch_size: int = 1024, hnsw_ef_search: int | None = None,
                 ivf_nprobe: int | None = None, bf16: bool = False) -> None:
    """Encode the queries (``batch_size`` at a time, cut at ``query_max_length`` tokens; None: the model's own
    max_seq_length), search the index and write a TREC run atomically."""
    query_ids, vectors = encode_queries(model_path, queries_parquet, max_length=query_max_length,
                                        batch_size=batch_size, bf16=bf16)
    logger.info("searching %s for %d queries (depth %d)", index_path, len(query_ids), depth)
    hits = search_index(index_path, ids_path, query_ids, vectors, depth=depth, batch_size=search_batch_size,
                        hnsw_ef_search=hnsw_ef_search, ivf_nprobe=ivf_nprobe)
    write_trec_run(hits, output_run, tag)
