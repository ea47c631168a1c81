"""faiss-gpu when it is importable and a GPU is visible, else faiss-cpu, with the same results."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpr_pipeline.retrieval.dense_index import build_index
from dpr_pipeline.retrieval.dense_search import cpu_search_note, gpus_available, search_index


@pytest.fixture
def index(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.save(tmp_path / "v.npy", vectors.astype(np.float16))
    pq.write_table(pa.table({"doc_id": [f"d{i}" for i in range(len(vectors))]}), tmp_path / "v.ids.parquet")
    build_index([tmp_path / "v.npy"], [tmp_path / "v.ids.parquet"], tmp_path / "index.faiss", tmp_path / "ids.parquet")
    queries = rng.standard_normal((300, 64)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return tmp_path / "index.faiss", tmp_path / "ids.parquet", [f"q{i}" for i in range(300)], queries


def test_cpu_search_without_a_gpu(index):
    if gpus_available():
        pytest.skip("a GPU is visible: the automatic choice is the GPU here")
    hits_auto = list(search_index(*index, depth=20))
    hits_cpu = list(search_index(*index, depth=20, use_gpu=False))
    assert hits_auto == hits_cpu
    with pytest.raises(RuntimeError, match="no GPU"):
        list(search_index(*index, depth=20, use_gpu=True))


@pytest.mark.gpu
@pytest.mark.skipif(not gpus_available(), reason="needs faiss-gpu and a visible GPU (envs/torch-gpu.yaml on a GPU node)")
def test_gpu_search_equals_cpu_search(index):
    cpu = list(search_index(*index, depth=100, use_gpu=False))
    gpu = list(search_index(*index, depth=100, use_gpu=True))
    assert [q for q, _ in cpu] == [q for q, _ in gpu]
    for (_, cpu_hits), (_, gpu_hits) in zip(cpu, gpu):
        np.testing.assert_allclose([s for _, s in cpu_hits], [s for _, s in gpu_hits], atol=1e-5)
        # the same documents, except where two scores tie within float rounding
        same = sum(a == b for (a, _), (b, _) in zip(cpu_hits, gpu_hits))
        assert same >= len(cpu_hits) - 2


def test_a_gpu_job_with_the_cpu_build_of_faiss_says_it_searches_on_the_cpu():
    """A GPU node whose install lacks faiss's GPU build: the job searches on the CPU (same hits) and says so,
    naming the fix; nothing to say without CUDA or with a faiss that uses the GPUs."""
    note = cpu_search_note(cuda_gpus=1, faiss_gpus=0)
    assert note.startswith("searching on the CPU: 1 CUDA GPU(s) visible, but this faiss") and "`gpu` extra" in note
    assert cpu_search_note(cuda_gpus=0, faiss_gpus=0) is None and cpu_search_note(cuda_gpus=2, faiss_gpus=2) is None
