"""Dense retrieval: encode the queries, search a faiss index of :mod:`.dense_index`, write a TREC run.

Where CUDA is visible the search runs on the GPU: a ``flat`` index exactly in PyTorch
(:mod:`.torch_flat_search`: the same hits as faiss-cpu, up to the order of scores equal within float rounding), an
``ivfpq`` index with faiss's GPU build (sharded over the visible GPUs; without that build the job stops and names
the fix); ``hnsw`` has no GPU version and searches on the CPU. Without CUDA, or with ``use_gpu=False``
(`index.search_device: cpu`), everything searches on the CPU with faiss-cpu.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator, Sequence

import faiss
import numpy as np
import torch

from dpr_pipeline.data.trec_runs import rank_order, write_trec_run
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.retrieval.dense_index import read_index_ids
from dpr_pipeline.retrieval.encode import encode_queries
from dpr_pipeline.retrieval.torch_flat_search import TorchFlatIndex

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
    (default) searches on the GPU where CUDA is visible (module docstring), True insists on it, False stays on the
    CPU.
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
    yield from ranked_hits(_search_device(index, use_gpu), doc_ids, query_ids, query_vectors, depth=depth,
                           batch_size=batch_size)


def ranked_hits(index: faiss.Index | TorchFlatIndex, doc_ids: np.ndarray, query_ids: Sequence[str],
                query_vectors: np.ndarray, *, depth: int,
                batch_size: int) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """:func:`search_index`'s hits from an open index (row ``i`` is ``doc_ids[i]``) on its device."""
    for start in range(0, len(query_ids), batch_size):
        batch = np.ascontiguousarray(query_vectors[start:start + batch_size], dtype=np.float32)
        scores, rows = _search_past_ties(index, batch, depth)
        for query_id, query_scores, query_rows in zip(query_ids[start:start + batch_size], scores, rows):
            found = query_rows >= 0
            hits = rank_order(zip(doc_ids[query_rows[found]].tolist(), query_scores[found].tolist()))
            yield query_id, hits[:depth]


def _search_past_ties(index: faiss.Index | TorchFlatIndex, batch: np.ndarray,
                      depth: int) -> tuple[np.ndarray, np.ndarray]:
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
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_available() -> int:
    """GPUs faiss itself can search on: 0 without faiss-gpu (faiss-cpu has no GPU code) or without a visible GPU."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def _search_device(index: faiss.Index, use_gpu: bool | None) -> faiss.Index | TorchFlatIndex:
    """The index itself (CPU), its vectors on the GPU (flat) or a faiss-gpu copy sharded over the GPUs (ivfpq)."""
    cuda = _cuda_gpus()
    if use_gpu is False or (use_gpu is None and cuda == 0):
        return index
    if cuda == 0:
        raise RuntimeError("use_gpu=True but torch sees no CUDA GPU")
    if isinstance(index, faiss.IndexHNSW):
        logger.info("HNSW has no GPU version: searching on the CPU")
        return index
    if isinstance(index, faiss.IndexFlat):
        logger.info("searching exactly on %s (PyTorch, float32)", torch.cuda.get_device_name(0))
        return TorchFlatIndex(index, "cuda")
    if gpus_available() == 0:
        raise ConfigError(
            f"a {type(index).__name__} index is searched on the GPU by faiss's GPU build, which this faiss "
            f"({faiss.__version__}) is not, and {cuda} CUDA GPU(s) are visible. Fix: install the project's `gpu` "
            "extra in the jobs' environment (docs/cluster.md, 'Software'), or search on the CPU: "
            "stages.retriever.index.search_device: cpu")
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True            # each GPU holds 1/n of the vectors
    options.useFloat16 = False      # float32 as on the CPU: the same scores
    logger.info("searching on %d GPU(s) (faiss-gpu)", gpus_available())
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
                 ivf_nprobe: int | None = None, bf16: bool = False, search_device: str = "auto") -> None:
    """Encode the queries (``batch_size`` at a time, cut at ``query_max_length`` tokens; None: the model's own
    max_seq_length), search the index (``search_device`` ``auto``: on the GPU where CUDA is visible, ``cpu``: on
    the CPU) and write a TREC run atomically."""
    query_ids, vectors = encode_queries(model_path, queries_parquet, max_length=query_max_length,
                                        batch_size=batch_size, bf16=bf16)
    logger.info("searching %s for %d queries (depth %d)", index_path, len(query_ids), depth)
    hits = search_index(index_path, ids_path, query_ids, vectors, depth=depth, batch_size=search_batch_size,
                        hnsw_ef_search=hnsw_ef_search, ivf_nprobe=ivf_nprobe,
                        use_gpu=False if search_device == "cpu" else None)
    write_trec_run(hits, output_run, tag)
