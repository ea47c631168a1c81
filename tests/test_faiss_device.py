"""Where the dense search runs: exact flat search in PyTorch on the job's GPU (the same hits as faiss-cpu), faiss-gpu
for ivfpq, the CPU without CUDA or when the config says so."""

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.retrieval import dense_search as dense_search_module
from dpr_pipeline.retrieval.dense_index import build_index
from dpr_pipeline.retrieval.dense_search import ranked_hits, search_index
from dpr_pipeline.retrieval.torch_flat_search import CHUNK_ROWS, TorchFlatIndex

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def unit_rows(rng, rows: int, dim: int) -> np.ndarray:
    vectors = rng.standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture
def index(tmp_path):
    rng = np.random.default_rng(0)
    vectors = unit_rows(rng, 5000, 64)
    np.save(tmp_path / "v.npy", vectors.astype(np.float16))
    pq.write_table(pa.table({"doc_id": [f"d{i}" for i in range(len(vectors))]}), tmp_path / "v.ids.parquet")
    build_index([tmp_path / "v.npy"], [tmp_path / "v.ids.parquet"], tmp_path / "index.faiss", tmp_path / "ids.parquet")
    return tmp_path / "index.faiss", tmp_path / "ids.parquet", [f"q{i}" for i in range(300)], unit_rows(rng, 300, 64)


def assert_same_hits(expected, found, tolerance: float = 1e-5):
    """The same queries, the same score at every rank, each document found with the score expected for it, and a
    document in one list only where its score is the cut's (within ``tolerance``): the hits are the same up to the
    order of scores equal within float32 rounding, which faiss and torch may break either way."""
    assert [q for q, _ in expected] == [q for q, _ in found]
    for (_, expected_hits), (_, found_hits) in zip(expected, found):
        assert len(expected_hits) == len(found_hits)
        np.testing.assert_allclose([s for _, s in expected_hits], [s for _, s in found_hits], atol=tolerance)
        expected_scores, found_scores = dict(expected_hits), dict(found_hits)
        for doc in expected_scores.keys() & found_scores.keys():
            assert abs(expected_scores[doc] - found_scores[doc]) <= tolerance
        for doc, score in [*expected_hits, *found_hits]:
            if doc not in expected_scores or doc not in found_scores:
                assert score <= expected_hits[-1][1] + tolerance


def test_torch_search_finds_faiss_cpus_hits_in_chunks_and_past_ties(index, monkeypatch):
    """On the CPU device, over several corpus chunks (a small CHUNK_ROWS), with more hits asked than there are
    vectors, and with exact duplicates straddling the cut (the tie rule's deeper search)."""
    faiss_index = faiss.read_index(str(index[0]))
    doc_ids = np.asarray([f"d{i}" for i in range(faiss_index.ntotal)], dtype=object)
    monkeypatch.setattr("dpr_pipeline.retrieval.torch_flat_search.CHUNK_ROWS", 700)
    on_torch = TorchFlatIndex(faiss_index, "cpu")
    assert len(on_torch.chunks) == 8 and CHUNK_ROWS > 700
    for depth in (1, 100, 6000):
        expected = list(ranked_hits(faiss_index, doc_ids, index[2], index[3], depth=depth, batch_size=128))
        assert_same_hits(expected, list(ranked_hits(on_torch, doc_ids, index[2], index[3], depth=depth,
                                                    batch_size=128)))
    scores, rows = on_torch.search(index[3][:2], 5001)
    assert (rows[:, -1] == -1).all() and np.isneginf(scores[:, -1]).all()

    duplicated = faiss.IndexFlatIP(64)
    base = unit_rows(np.random.default_rng(1), 50, 64)
    duplicated.add(np.concatenate([base, base[:1], base[:1]]))       # rows 0, 50, 51 equal
    ids = np.asarray([f"d{i:02d}" for i in range(52)], dtype=object)
    query = base[:1]
    for tie_depth in (1, 2):
        faiss_hits = list(ranked_hits(duplicated, ids, ["q"], query, depth=tie_depth, batch_size=1))
        torch_hits = list(ranked_hits(TorchFlatIndex(duplicated, "cpu"), ids, ["q"], query, depth=tie_depth,
                                      batch_size=1))
        assert faiss_hits == torch_hits and [d for d, _ in torch_hits[0][1]] == ["d00", "d50"][:tie_depth]


def test_cpu_search_without_cuda_or_when_the_config_says_so(index, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible: the automatic choice is the GPU here")
    hits_auto = list(search_index(*index, depth=20))
    assert hits_auto == list(search_index(*index, depth=20, use_gpu=False))
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        list(search_index(*index, depth=20, use_gpu=True))
    # a GPU node: flat goes to torch unless use_gpu=False (index.search_device: cpu)
    monkeypatch.setattr(dense_search_module, "_cuda_gpus", lambda: 1)
    flat = faiss.read_index(str(index[0]))
    assert dense_search_module._search_device(flat, False) is flat


def test_an_ivfpq_index_on_a_gpu_node_without_faiss_gpu_stops_and_names_the_fix(monkeypatch):
    """No silent CPU search where CUDA is visible: ivfpq needs faiss's GPU build, or `search_device: cpu`."""
    monkeypatch.setattr(dense_search_module, "_cuda_gpus", lambda: 2)
    monkeypatch.setattr(dense_search_module, "gpus_available", lambda: 0)
    ivf = faiss.index_factory(16, "IVF4,PQ4x8np", faiss.METRIC_INNER_PRODUCT)
    with pytest.raises(ConfigError, match="2 CUDA GPU.*`gpu` extra.*search_device: cpu"):
        dense_search_module._search_device(ivf, None)
    assert dense_search_module._search_device(ivf, False) is ivf
    hnsw = faiss.IndexHNSWFlat(16, 8, faiss.METRIC_INNER_PRODUCT)
    assert dense_search_module._search_device(hnsw, None) is hnsw    # no GPU version: the kind says CPU


@pytest.mark.gpu
@needs_cuda
def test_gpu_search_equals_cpu_search(index):
    cpu = list(search_index(*index, depth=100, use_gpu=False))
    assert_same_hits(cpu, list(search_index(*index, depth=100)))
    assert_same_hits(cpu, list(search_index(*index, depth=100, use_gpu=True)))


@pytest.mark.gpu
@needs_cuda
def test_gpu_search_refuses_a_corpus_larger_than_the_gpus_free_memory(monkeypatch):
    free, total = torch.cuda.mem_get_info()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 2**30, total))
    flat = faiss.IndexFlatIP(8)
    flat.add(np.ones((4, 8), np.float32))
    with pytest.raises(ConfigError, match="GiB free.*ivfpq.*search_device: cpu"):
        TorchFlatIndex(flat, "cuda")
