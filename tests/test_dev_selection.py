"""What a trained bi-encoder stage hands on (dpr_pipeline.training.dev_selection): the trained model, or its start where
that scores higher on the dev split; the pool it is scored in; the record and its sentence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import make_tiny_bert
from test_training import TOPICS, write_training_data

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.evaluation.metrics import evaluate_run
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_encoder, load_tokenizer
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.training.dev_selection import dev_pool, pool_run, select
from dpr_pipeline.training.groups import read_queries
from dpr_pipeline.training.selection_record import START, TRAINED, choose, describe
from dpr_pipeline.workflow import stage_settings as settings
from dpr_pipeline.workflow.config import validate_config

PARAMS = {"query_max_length": 16, "passage_max_length": 24, "bf16": False, "seed": 1}


def write_run(path: Path, hits: dict[str, list[str]]) -> Path:
    path.write_text("".join(f"{query} Q0 {doc} {rank} {100 - rank} bm25\n"
                            for query, docs in hits.items() for rank, doc in enumerate(docs, 1)))
    return path


def write_qrels(path: Path, judged: list[tuple[str, str, int]]) -> Path:
    write_artifact(pd.DataFrame(judged, columns=["query_id", "doc_id", "relevance"]), path, "qrels")
    return path


def test_the_trained_model_goes_on_when_at_or_above_its_start_else_the_start():
    assert choose(0.51, 0.50) == TRAINED
    assert choose(0.50, 0.50) == TRAINED           # "at or above its start"
    assert choose(0.49, 0.50) == START


def test_the_pool_is_every_dev_querys_top_k_of_each_run_and_judged_passages(tmp_path):
    data = write_training_data(tmp_path)
    passages = PassageStore.open(data / "passages.arrow")
    bm25 = write_run(tmp_path / "bm25.trec", {"q0": ["x0", "x1", "x2"], "q1": ["x3", "d1", "x4"], "q2": ["x5"]})
    start = write_run(tmp_path / "start.trec", {"q0": ["d5", "x0", "x6"], "q1": ["d7", "x7"]})
    # q2 has no relevant judgement: not a dev query of the pool (nor are its hits)
    qrels = write_qrels(tmp_path / "qrels.parquet", [("q0", "d0", 1), ("q1", "d1", 2), ("q2", "d2", 0)])
    pool = dev_pool(data / "queries.parquet", qrels, [bm25], passages, depth=2)
    assert pool.query_ids == ["q0", "q1"] and pool.queries == ["why do cats purr", "why do dogs bark"]
    assert pool.doc_ids == ["d0", "d1", "x0", "x1", "x3"]
    assert pool.passages[0] == passages.passages(passages.rows_of(["d0"]))[0]
    pool = dev_pool(data / "queries.parquet", qrels, [bm25, start], passages, depth=2)
    assert pool.doc_ids == ["d0", "d1", "d5", "d7", "x0", "x1", "x3", "x7"]

    write_run(start, {"q0": ["gone"]})
    with pytest.raises(DataError, match=r"start.trec: document 'gone' of the run is not in the corpus"):
        dev_pool(data / "queries.parquet", qrels, [bm25, start], passages, depth=2)


def test_a_pool_run_ranks_each_query_by_dot_product(tmp_path):
    data = write_training_data(tmp_path)
    passages = PassageStore.open(data / "passages.arrow")
    run = write_run(tmp_path / "run.trec", {"q0": ["x0", "x1"], "q1": ["x2", "x3"]})
    qrels = write_qrels(tmp_path / "qrels.parquet", [("q0", "d0", 1), ("q1", "d1", 1)])
    pool = dev_pool(data / "queries.parquet", qrels, [run], passages, depth=2)   # d0 d1 x0 x1 x2 x3
    passage_vectors = np.eye(6, dtype=np.float32)
    right = pool_run(np.eye(6, dtype=np.float32)[:2], passage_vectors, pool)  # q0 -> d0, q1 -> d1 first
    wrong = pool_run(np.eye(6, dtype=np.float32)[[2, 0]], passage_vectors, pool)  # q0 -> x0 first, q1 -> d0
    assert right.groupby("query_id")["doc_id"].first().to_dict() == {"q0": "d0", "q1": "d1"}
    assert evaluate_run(right, pool.qrels, ["nDCG@10"])["nDCG@10"] == pytest.approx(1.0)
    assert evaluate_run(wrong, pool.qrels, ["nDCG@10"])["nDCG@10"] < 1.0


@pytest.fixture
def dev_files(tmp_path):
    """The toy collection, two tiny BERTs (`a`, `b`: other random weights) and dev qrels that judge relevant, for
    each query, the passage `a` ranks first: `a` scores nDCG@10 1 on the pool, `b` less."""
    data = write_training_data(tmp_path / "data")
    a, b = make_tiny_bert(tmp_path / "a", dropout=0.0, seed=0), make_tiny_bert(tmp_path / "b", dropout=0.0, seed=5)
    passages, queries = PassageStore.open(data / "passages.arrow"), read_queries(data / "queries.parquet")
    doc_ids = passages.doc_ids(np.arange(len(passages)))
    run = write_run(tmp_path / "bm25.trec", {f"q{i}": doc_ids for i in range(len(TOPICS))})
    encoder, tokenizer = load_text_encoder(str(a)), load_tokenizer(str(a))
    q = encode_texts(encoder, tokenizer, list(queries.values()), max_length=16, batch_size=8, device="cpu")
    d = encode_texts(encoder, tokenizer, passages.passages(np.arange(len(passages))), max_length=24, batch_size=8,
                     device="cpu")
    firsts = [doc_ids[int(i)] for i in (q @ d.T).argmax(axis=1)]
    qrels = write_qrels(tmp_path / "qrels.parquet", [(query, doc, 1) for query, doc in zip(queries, firsts)])
    return {"data": data, "a": a, "b": b, "passages": passages,
            "files": {"queries": data / "queries.parquet", "qrels": qrels, "pool_run": run}}


def selection_settings(files: dict, **changes) -> dict:
    return {"split": "dev", "reason": None, "metric": "nDCG@10", "pool_depth": 16, "relevance_level": 1,
            "encode_batch_size": 8, "label": "Retriever₂", "start_label": "Retriever₁", "start_stage": None,
            "files": files, **changes}


def test_a_trained_model_below_its_start_on_dev_is_not_handed_on(dev_files, caplog):
    a, b = (load_text_encoder(str(dev_files[name])) for name in ("a", "b"))
    tokenizer = load_tokenizer(str(dev_files["a"]))
    selection = selection_settings(dev_files["files"])
    handed_on, record = select(b, lambda: a, tokenizer, dev_files["passages"], {**PARAMS, "plm": "a"}, selection)
    assert handed_on is a and record["handed_on"] == START
    assert record["start_score"] == pytest.approx(1.0) and record["trained_score"] < 1.0
    assert record["difference"] == pytest.approx(record["trained_score"] - 1.0)
    assert record["pool"] == {"queries": 8, "passages": 16} and record["start_score_from"] == "searching the pool"
    assert "Retriever₂ did not beat its start (Retriever₁) on dev (-0." in caplog.text
    assert "its start was handed on" in describe(record)

    handed_on, record = select(a, lambda: b, tokenizer, dev_files["passages"], {**PARAMS, "plm": "b"}, selection)
    assert handed_on is a and record["handed_on"] == TRAINED and record["difference"] > 0
    assert "at or above its start (Retriever₁)" in describe(record)


def test_a_start_with_a_dev_run_is_scored_by_it_and_its_hits_join_the_pool(dev_files, tmp_path):
    """Retriever2 starting from Retriever1: Retriever1's dev run is its score (the summary's figure) and its top
    hits are in the pool; the start is not loaded unless it goes on."""
    b = load_text_encoder(str(dev_files["b"]))
    firsts = pd.read_parquet(dev_files["files"]["qrels"]).set_index("query_id")["doc_id"]
    # the start's run: every query's judged passage second (nDCG@10 1/log2(3)), x7 first
    start_run = write_run(tmp_path / "start_dev.trec", {q: ["x7", doc] for q, doc in firsts.items()})
    files = {**dev_files["files"], "pool_run": write_run(tmp_path / "bm25.trec", {q: ["x0"] for q in firsts.index}),
             "start_run": start_run}
    selection = selection_settings(files, start_stage="retriever1", pool_depth=1)

    def never():
        raise AssertionError("the start was loaded although its dev run scored it and the trained model won")

    handed_on, record = select(b, never, load_tokenizer(str(dev_files["b"])), dev_files["passages"],
                               {**PARAMS, "plm": "r1"}, selection)
    assert record["start_score"] == pytest.approx(1 / np.log2(3)) and record["start_score_from"].endswith(
        "start_dev.trec")
    assert record["pool"]["passages"] == len({"x0", "x7", *firsts})              # BM25's x0, the start's x7, judged
    assert handed_on is b and record["handed_on"] == TRAINED     # b puts more judged passages first than the run


def test_without_a_dev_split_the_trained_model_goes_on_and_the_record_says_why(dev_files, caplog):
    b = load_text_encoder(str(dev_files["b"]))
    selection = selection_settings({}, split=None, reason="the dataset has no dev_split")
    handed_on, record = select(b, None, None, {}, {**PARAMS, "plm": "p"}, selection)
    assert handed_on is b and record["handed_on"] == TRAINED and record["reason"] == "the dataset has no dev_split"
    assert "handed on without a dev check (the dataset has no dev_split)" in caplog.text


def test_the_training_job_saves_its_start_when_training_made_it_worse_on_dev(dev_files, tmp_path):
    """The dev qrels favour the start (`a`'s own first hits): after training on the toy task the saved model is
    `a`'s weights, unchanged, and dev_selection.json says so."""
    data, a = dev_files["data"], dev_files["a"]
    params = {**PARAMS, "plm": str(a), "learning_rate": 1e-2, "warmup_steps": 1, "batch_size": 4, "epochs": 1,
              "min_steps": 6, "save_steps": 100, "negatives_per_query": 3, "temperature": 0.1}
    out, record_path = tmp_path / "model", tmp_path / "dev_selection.json"
    train_biencoder(data / "negatives.parquet", data / "passages.arrow", data / "queries.parquet", out,
                    tmp_path / "ckpt", tmp_path / "loss.jsonl", params,
                    selection={**selection_settings(dev_files["files"]), "output": str(record_path)})
    assert len((tmp_path / "loss.jsonl").read_text().splitlines()) == 6          # min_steps: 2 steps an epoch
    record = json.loads(record_path.read_text())
    assert record["handed_on"] == START and record["trained_score"] < record["start_score"]
    saved, start = load_encoder(str(out)).state_dict(), load_encoder(str(a)).state_dict()
    for name in start:
        torch.testing.assert_close(saved[name], start[name], msg=name)


BUNDLED = Path(__file__).resolve().parents[1] / "config.yaml"


def test_each_trained_bi_encoder_knows_its_start_and_whether_it_can_choose():
    config = validate_config(yaml.safe_load(BUNDLED.read_text()))
    first, second, student = (settings.selection(config, "scifact", stage)
                              for stage in ("retriever1", "retriever2", "distill"))
    assert first["split"] == "dev" and first["start_label"] == "Starting model (untrained)"
    assert first["start_stage"] == "start" and first["metric"] == "nDCG@10" and first["pool_depth"] == 10
    assert (second["start_stage"], second["start_label"]) == ("retriever1", "Retriever₁")   # retriever2_start
    assert (student["start_stage"], student["label"]) == ("retriever2", "Retriever_distill")
    assert settings.selection(config, "scifact", "ablation/simlm")["split"] is None
    assert settings.selection(config, "msmarco", "retriever1")["reason"] == "the dataset has no dev_split"
    misspelt = yaml.safe_load(BUNDLED.read_text())
    misspelt["datasets"]["scifact"]["stages"]["selection"] = {"metric": "nDCGG@10"}
    with pytest.raises(ConfigError, match="stages.selection.metric: unknown metric 'nDCGG@10'"):
        validate_config(misspelt)
