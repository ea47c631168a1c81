"""Exact inner-product search on a GPU with PyTorch: a flat faiss index's vectors in float32 on the device, each
query batch scored against them chunk by chunk (matmul) and the best hits merged (top-k).

What a GPU node needs to search without faiss's GPU build (whose PyPI wheel wants CUDA 12's own libraries): the
torch of the training jobs already drives the GPU. Scores are float32 products at full precision (no TF32), so the
hits are faiss-cpu's ``IndexFlatIP`` hits up to the order of scores equal within float rounding.
:mod:`.dense_search` uses it for a ``flat`` index wherever CUDA is visible.
"""

from __future__ import annotations

import contextlib

import faiss
import numpy as np
import torch

from dpr_pipeline.errors import ConfigError

#: Corpus rows scored per matmul: a batch of 1,024 queries makes a 1 GiB float32 score block.
CHUNK_ROWS = 262_144
#: GPU memory kept free beside the vectors (score blocks, top-k buffers, the query encoder's leftovers).
HEADROOM_BYTES = 4 * 2**30


class TorchFlatIndex:
    """A flat inner-product faiss index's vectors on ``device``, searched exactly. ``ntotal``, ``d`` and
    ``search(queries, k) -> (scores, rows)`` as faiss's, so :mod:`.dense_search` treats both alike."""

    def __init__(self, index: faiss.Index, device: torch.device | str) -> None:
        if not isinstance(index, faiss.IndexFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ValueError(f"exact GPU search takes a flat inner-product index, not a {type(index).__name__}")
        self.device = torch.device(device)
        self.ntotal, self.d = int(index.ntotal), int(index.d)
        _check_fits(self.ntotal * self.d * 4, self.device)
        vectors = faiss.rev_swig_ptr(index.get_xb(), self.ntotal * self.d).reshape(self.ntotal, self.d) \
            if self.ntotal else np.zeros((0, self.d), np.float32)
        self.chunks = [torch.from_numpy(vectors[start:start + CHUNK_ROWS]).to(self.device)
                       for start in range(0, self.ntotal, CHUNK_ROWS)]

    @torch.inference_mode()
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best rows of each query (best first) and their scores; ``k`` above ``ntotal`` pads with
        row -1 and score -inf, as faiss does."""
        found = min(k, self.ntotal)
        batch = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)
        best_scores, best_rows = [], []
        with full_float32_matmul():
            for number, chunk in enumerate(self.chunks):
                scores, rows = torch.topk(batch @ chunk.T, min(found, len(chunk)), dim=1)
                best_scores.append(scores)
                best_rows.append(rows + number * CHUNK_ROWS)
        scores, picked = torch.topk(torch.cat(best_scores, dim=1), found, dim=1) if found else \
            (torch.zeros((len(queries), 0), device=self.device), torch.zeros((len(queries), 0), dtype=torch.long))
        rows = torch.gather(torch.cat(best_rows, dim=1), 1, picked) if found else picked
        scores, rows = scores.float().cpu().numpy(), rows.cpu().numpy()
        if found < k:
            scores = np.pad(scores, ((0, 0), (0, k - found)), constant_values=-np.inf)
            rows = np.pad(rows, ((0, 0), (0, k - found)), constant_values=-1)
        return scores, rows


@contextlib.contextmanager
def full_float32_matmul():
    """float32 matrix products at full precision inside (no TF32, whatever the training code set), restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _check_fits(vector_bytes: int, device: torch.device) -> None:
    """A corpus too large for the GPU stops before the copy, naming what to change."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    if vector_bytes + HEADROOM_BYTES > free:
        raise ConfigError(
            f"the flat index's vectors take {vector_bytes / 2**30:.1f} GiB in float32, and {device} has "
            f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free (the search keeps {HEADROOM_BYTES / 2**30:.0f} GiB "
            "beside them). Fix: run the dense_search jobs on GPUs with more memory, use an `ivfpq` index "
            "(stages.retriever.index.kind), or search on the CPU (stages.retriever.index.search_device: cpu)")
