"""What a trained bi-encoder stage hands on (dpr_pipeline.training.dev_selection): the trained model, or its start where
the trained model is not above it on the dev split, each searched in the whole corpus; the record and its sentence."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import make_tiny_bert
from test_training import write_training_data

from dpr_pipeline.data.passage_store import PassageStore
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_encoder, load_tokenizer
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.training.dev_selection import corpus_run, dev_queries, select, top_hits
from dpr_pipeline.training.groups import read_queries
from dpr_pipeline.training.selection_record import START, TRAINED, choose, describe
from dpr_pipeline.training.settings import BiEncoderSettings, DevFiles, DevSelection, DevSelectionSettings
from dpr_pipeline.orchestration import stage_settings as settings
from dpr_pipeline.orchestration.config import validate_config

PARAMS = {"query_max_length": 16, "passage_max_length": 24, "bf16": False, "seed": 1, "min_steps": 0}


def started_from(plm: str) -> BiEncoderSettings:
    """A bi-encoder stage's settings with ``plm`` its start (select reads the plm, the lengths and bf16)."""
    return BiEncoderSettings.from_params({**PARAMS, "plm": plm, "learning_rate": 1e-2, "warmup_steps": 1,
                                          "batch_size": 4, "epochs": 1, "negatives_per_query": 3})


def write_run(path: Path, hits: dict[str, list[str]]) -> Path:
    path.write_text("".join(f"{query} Q0 {doc} {rank} {100 - rank} bm25\n"
                            for query, docs in hits.items() for rank, doc in enumerate(docs, 1)))
    return path


def write_qrels(path: Path, judged: list[tuple[str, str, int]]) -> Path:
    write_artifact(pd.DataFrame(judged, columns=["query_id", "doc_id", "relevance"]), path, "qrels")
    return path


def test_the_trained_model_goes_on_only_when_above_its_start():
    assert choose(0.51, 0.50) == TRAINED
    assert choose(0.50, 0.50) == START             # "not above its start": the start goes on
    assert choose(0.49, 0.50) == START


def test_the_running_top_hits_keep_each_querys_best_in_order():
    scores = np.array([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 0.8]], dtype=np.float32)
    rows = np.tile(np.arange(10, 14), (2, 1))
    best, found = top_hits(scores, rows, 2)
    np.testing.assert_array_equal(best, np.array([[0.9, 0.7], [0.8, 0.8]], dtype=np.float32))
    assert found[0].tolist() == [11, 13] and sorted(found[1].tolist()) == [12, 13]
    best, found = top_hits(scores[:, :1], rows[:, :1], 3)                    # fewer candidates than the depth
    assert found.tolist() == [[10], [10]]


def test_a_corpus_run_is_the_exact_search_of_every_passage_chunk_by_chunk(tmp_path, monkeypatch):
    """The dev queries searched in the whole corpus give the run an exact dot-product search gives, however the
    corpus is cut into chunks."""
    from dpr_pipeline.training import dev_selection

    data = write_training_data(tmp_path / "data")
    model = make_tiny_bert(tmp_path / "m", dropout=0.0)
    encoder, tokenizer = load_text_encoder(str(model)), load_tokenizer(str(model))
    passages, queries = PassageStore.open(data / "passages.arrow"), read_queries(data / "queries.parquet")
    ids = list(queries)
    qrels = write_qrels(tmp_path / "qrels.parquet", [(q, "d0", 1) for q in ids[:3]] + [(ids[3], "x1", 0)])
    dev = dev_queries(data / "queries.parquet", qrels)
    assert dev.query_ids == sorted(ids[:3])                   # a query without a relevant judgement is no dev query
    q = encode_texts(encoder, tokenizer, dev.queries, max_length=16, batch_size=8, device="cpu")
    d = encode_texts(encoder, tokenizer, passages.passages(np.arange(len(passages))), max_length=24, batch_size=8,
                     device="cpu")
    scores = q @ d.T
    expected = [[passages.doc_ids([i])[0] for i in np.argsort(-row, kind="stable")[:5]] for row in scores]
    whole = corpus_run(encoder, tokenizer, dev, passages, depth=5, query_max_length=16, passage_max_length=24,
                       batch_size=8)                         # one chunk
    monkeypatch.setattr(dev_selection, "MIN_CHUNK", 3)
    monkeypatch.setattr(dev_selection, "CORPUS_CHUNK", 3)    # then 3 passages a chunk
    chunked = corpus_run(encoder, tokenizer, dev, passages, depth=5, query_max_length=16, passage_max_length=24,
                         batch_size=8)
    for run in (whole, chunked):
        assert run.groupby("query_id", sort=False)["doc_id"].apply(list).tolist() == expected
        assert run["rank"].tolist() == list(range(1, 6)) * 3
    np.testing.assert_allclose(chunked["score"], whole["score"], rtol=1e-5)


@pytest.fixture
def dev_files(tmp_path):
    """The toy collection, two tiny BERTs (`a`, `b`: other random weights) and dev qrels that judge relevant, for
    each query, the passage `a` ranks first: `a` scores nDCG@10 1 in the corpus, `b` less."""
    data = write_training_data(tmp_path / "data")
    a, b = make_tiny_bert(tmp_path / "a", dropout=0.0, seed=0), make_tiny_bert(tmp_path / "b", dropout=0.0, seed=5)
    passages, queries = PassageStore.open(data / "passages.arrow"), read_queries(data / "queries.parquet")
    doc_ids = passages.doc_ids(np.arange(len(passages)))
    encoder, tokenizer = load_text_encoder(str(a)), load_tokenizer(str(a))
    q = encode_texts(encoder, tokenizer, list(queries.values()), max_length=16, batch_size=8, device="cpu")
    d = encode_texts(encoder, tokenizer, passages.passages(np.arange(len(passages))), max_length=24, batch_size=8,
                     device="cpu")
    firsts = [doc_ids[int(i)] for i in (q @ d.T).argmax(axis=1)]
    qrels = write_qrels(tmp_path / "qrels.parquet", [(query, doc, 1) for query, doc in zip(queries, firsts)])
    return {"data": data, "a": a, "b": b, "passages": passages,
            "files": {"queries": data / "queries.parquet", "qrels": qrels}}


def selection_settings(files: dict, output: str = "unwritten.json", **changes) -> DevSelection:
    params = {"split": "dev", "reason": None, "metric": "nDCG@10", "depth": 16, "relevance_level": 1,
              "encode_batch_size": 8, "embedding_dtype": "float32", "ignore_identical_ids": False,
              "label": "Retriever₂", "start_label": "Retriever₁", "start_stage": None, **changes}
    return DevSelection(DevSelectionSettings.from_params(params), DevFiles(**files), output)


def test_a_trained_model_below_its_start_on_dev_is_not_handed_on(dev_files, caplog):
    a, b = (load_text_encoder(str(dev_files[name])) for name in ("a", "b"))
    tokenizer = load_tokenizer(str(dev_files["a"]))
    selection = selection_settings(dev_files["files"])
    handed_on, record = select(b, lambda: a, tokenizer, dev_files["passages"], started_from("a"), selection)
    assert handed_on is a and record["handed_on"] == START
    assert record["start_score"] == pytest.approx(1.0) and record["trained_score"] < 1.0
    assert record["difference"] == pytest.approx(record["trained_score"] - 1.0)
    assert record["searched"] == {"queries": 8, "passages": 16}
    assert record["start_score_from"] == "searching the whole corpus"
    assert record["paired"]["queries"] == 8 and record["paired"]["mean"] == pytest.approx(record["difference"])
    assert "Retriever₂ is not above its start (Retriever₁) on dev (-0." in caplog.text
    assert "over its 8 queries, each searched in the whole corpus of 16 passages; 95 % interval ±" in caplog.text
    assert "its start was handed on" in describe(record)

    handed_on, record = select(a, lambda: b, tokenizer, dev_files["passages"], started_from("b"), selection)
    assert handed_on is a and record["handed_on"] == TRAINED and record["difference"] > 0
    assert "is above its start (Retriever₁)" in describe(record)


def test_a_start_with_a_dev_run_is_scored_by_it(dev_files, tmp_path):
    """Retriever2 starting from Retriever1: Retriever1's dev run is its score (the summary's figure); the start
    is not loaded unless it goes on."""
    b = load_text_encoder(str(dev_files["b"]))
    firsts = pd.read_parquet(dev_files["files"]["qrels"]).set_index("query_id")["doc_id"]
    # the start's run: every query's judged passage second (nDCG@10 1/log2(3)), x7 first
    start_run = write_run(tmp_path / "start_dev.trec", {q: ["x7", doc] for q, doc in firsts.items()})
    files = {**dev_files["files"], "start_run": start_run}
    selection = selection_settings(files, start_stage="retriever1")

    def never():
        raise AssertionError("the start was loaded although its dev run scored it and the trained model won")

    handed_on, record = select(b, never, load_tokenizer(str(dev_files["b"])), dev_files["passages"],
                               started_from("r1"), selection)
    assert record["start_score"] == pytest.approx(1 / np.log2(3)) and record["start_score_from"].endswith(
        "start_dev.trec")
    assert record["searched"]["passages"] == len(dev_files["passages"])
    assert handed_on is b and record["handed_on"] == TRAINED     # b puts more judged passages first than the run


def test_without_a_dev_split_the_trained_model_goes_on_and_the_record_says_why(dev_files, caplog):
    b = load_text_encoder(str(dev_files["b"]))
    selection = selection_settings({}, split=None, reason="the dataset has no dev_split")
    handed_on, record = select(b, None, None, {}, started_from("p"), selection)
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
                    tmp_path / "ckpt", tmp_path / "loss.jsonl", BiEncoderSettings.from_params(params),
                    selection=selection_settings(dev_files["files"], str(record_path)))
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
    assert first["start_stage"] == "start" and first["metric"] == "nDCG@10" and first["depth"] == 1000
    assert first["embedding_dtype"] == "float16" and first["ignore_identical_ids"] is False
    assert (second["start_stage"], second["start_label"]) == ("retriever1", "Retriever₁")   # retriever2.plm
    assert (student["start_stage"], student["label"]) == ("retriever2", "Retriever_distill")
    assert (student["teacher_stage"], student["teacher_label"]) == ("reranker", "Re-ranker")
    assert "teacher_stage" not in first and "teacher_stage" not in second
    assert DevSelectionSettings.from_params(student).teacher_stage == "reranker"         # the job's adapter's
    assert DevSelectionSettings.from_params(first).teacher_stage is None
    assert settings.selection(config, "scifact", "ablation/simlm")["split"] is None
    assert settings.selection(config, "msmarco", "retriever1")["reason"] == "the dataset has no dev_split"
    misspelt = yaml.safe_load(BUNDLED.read_text())
    misspelt["datasets"]["scifact"]["stages"]["selection"] = {"metric": "nDCGG@10"}
    with pytest.raises(ConfigError, match="stages.selection.metric: unknown metric 'nDCGG@10'"):
        validate_config(misspelt)


def test_a_student_is_not_trained_from_a_teacher_not_above_its_start(tmp_path, caplog):
    """The distilled retriever's teacher (the re-ranker) scores no higher than the student's start (Retriever2) on
    dev: the job hands the start on untrained, with an empty loss log and a record that says why."""
    from dpr_pipeline.orchestration.training_job import hand_on_start, teacher_verdict

    teacher, start = tmp_path / "reranker.json", tmp_path / "retriever2.json"
    start.write_text(json.dumps({"dev": {"nDCG@10": 0.70}, "test": {"nDCG@10": 0.9}}))
    selection = selection_settings({"teacher_metrics": teacher, "start_metrics": start},
                                   str(tmp_path / "dev_selection.json"), label="Retriever_distill",
                                   start_label="Retriever₂", start_stage="retriever2", teacher_stage="reranker",
                                   teacher_label="Re-ranker")
    teacher.write_text(json.dumps({"dev": {"nDCG@10": 0.71}}))
    assert teacher_verdict(selection, "r2") is None                          # above: the student trains
    assert teacher_verdict(replace(selection, files=DevFiles()), "r2") is None      # no check asked
    teacher.write_text(json.dumps({"dev": {"nDCG@10": 0.70}}))
    record = teacher_verdict(selection, "r2")
    assert record["handed_on"] == START and "(0.7000 against 0.7000 nDCG@10)" in record["reason"]
    model = make_tiny_bert(tmp_path / "r2")
    out, losses = tmp_path / "distill" / "model", tmp_path / "distill" / "loss_log.jsonl"
    hand_on_start(str(model), str(out), str(losses), selection.output, record)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in model.iterdir())
    assert losses.read_text() == "" and json.loads(Path(selection.output).read_text()) == record
    assert ("Retriever_distill was not trained: its teacher (Re-ranker) is not above its start on dev (0.7000 "
            "against 0.7000 nDCG@10)") in caplog.text and "its start (Retriever₂) was handed on." in caplog.text
    teacher.write_text(json.dumps({"test": {"nDCG@10": 0.8}}))
    with pytest.raises(DataError, match="has no dev nDCG@10 to compare the teacher"):
        teacher_verdict(selection, "r2")
