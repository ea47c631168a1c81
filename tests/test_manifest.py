"""Per-stage manifests: content hashes, negatives per query (by hand), software versions."""

import hashlib
import json
import shutil

import pytest

from dpr_pipeline.orchestration.manifests import build_manifest, file_sha256, negatives_per_query, write_manifest


def test_file_hash_is_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"passage")
    assert file_sha256(path) == hashlib.sha256(b"passage").hexdigest()


def test_folder_hash_depends_on_contents_and_names_not_location(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    expected = hashlib.sha256(
        f"config.json\t{hashlib.sha256(b'{}').hexdigest()}\nsub/weights.bin\t{hashlib.sha256(bytes([0, 1])).hexdigest()}\n"
        .encode()).hexdigest()
    assert file_sha256(model) == expected
    copy = shutil.copytree(model, tmp_path / "elsewhere" / "copy")
    assert file_sha256(copy) == expected
    (copy / ".snakemake_timestamp").write_text("")       # Snakemake marks a folder output after the job
    assert file_sha256(copy) == expected
    (copy / "sub" / "weights.bin").write_bytes(b"\x00\x02")
    assert file_sha256(copy) != expected
    (model / "sub" / "weights.bin").rename(model / "sub" / "renamed.bin")
    assert file_sha256(model) != expected


def test_in_batch_negatives_by_hand():
    # global batch of 4 groups of 1 positive + 3 hard negatives: each query scores 16 passages, 1 positive
    summary = negatives_per_query([0, 2, 5, 7], 3, batch_size=4, in_batch=True)
    assert summary["effective_per_query"] == 15
    assert summary["queries"] == 4 and summary["queries_trained"] == 3      # the query without negatives is left out
    assert summary["queries_with_fewer_than_asked"] == 1                    # 2 < 3: drawn with replacement
    assert summary["available_per_query"] == {"min": 2, "median": 5, "max": 7}


def test_listwise_negatives_are_the_hard_ones():
    summary = negatives_per_query([63, 80], 63, batch_size=8, in_batch=False)
    assert summary["effective_per_query"] == 63 and summary["queries_with_fewer_than_asked"] == 0
    with pytest.raises(ValueError, match="batch_size"):
        negatives_per_query([1], 1, in_batch=True)


def test_manifest_records_hashes_settings_and_software(tmp_path):
    data = tmp_path / "negatives.parquet"
    data.write_bytes(b"parquet bytes")
    manifest = build_manifest(stage="retriever1", dataset="toy", rule="train_retriever",
                              inputs={"negatives": str(data), "plm": "bert-base-uncased"},
                              outputs={"shards": [str(data)]}, parameters={"retriever": {"seed": 3}},
                              config={"datasets": {}}, seed=3, world_size=4, negatives=None)
    assert manifest["inputs"]["negatives"] == {"path": str(data), "sha256": hashlib.sha256(b"parquet bytes").hexdigest()}
    assert manifest["inputs"]["plm"] == {"path": "bert-base-uncased", "sha256": None}   # a Hub name, not a file
    assert manifest["outputs"]["shards"][0]["sha256"] == manifest["inputs"]["negatives"]["sha256"]
    assert manifest["seed"] == 3 and manifest["world_size"] == 4
    software = manifest["software"]
    assert software["packages"]["torch"] and software["packages"]["transformers"] and software["python"]
    assert software["git_commit"] is None or len(software["git_commit"]) == 40
    write_manifest(tmp_path / "out" / "manifest.json", manifest)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest


def test_manifest_records_the_overlap_setting_and_the_code_that_ran(tmp_path):
    from conftest import REPO

    from dpr_pipeline.orchestration.config import load_config

    config = load_config(REPO / "config.yaml")   # resolved: schema defaults filled in
    manifest = build_manifest(stage="bm25", dataset="scifact", rule="bm25_index", inputs={}, outputs={},
                              parameters={}, config=config, seed=None, world_size=1, negatives=None)
    assert manifest["config"]["datasets"]["scifact"]["allow_overlap"] == ["870", "1292"]
    assert manifest["config"]["datasets"]["msmarco"]["allow_overlap"] is False      # the default, written out
    assert manifest["software"]["dpr_pipeline_file"] == str(REPO / "src" / "dpr_pipeline" / "__init__.py")
