"""Experiment tracking (training/tracking.py): each backend's run read back through its own API, a tiny training of
two stages tracked to TensorBoard and an MLflow file store, and the default (off) writing nothing."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from conftest import REPO, make_tiny_bert
from test_training import write_training_data

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.training.settings import BiEncoderSettings
from dpr_pipeline.training.tracking import (
    EXTRA,
    MLFLOW_FILE_STORE,
    NullTracker,
    TrackingRun,
    check_installed,
    dev_scores,
    evaluation_scalars,
    log_once,
    mlflow_key,
    open_tracker,
    tracking_run,
)
from dpr_pipeline.orchestration.config import validate_config

SCHEMA = REPO / "schemas" / "config.schema.yaml"


def config_with(tracking: dict | None = None) -> dict:
    config = {"datasets": {"tiny": {"format": "beir", "path": "data/tiny", "eval_splits": ["test"]}},
              "run_datasets": ["tiny"]}
    if tracking is not None:
        config["tracking"] = tracking
    validate_config(config, SCHEMA)
    return config


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``folder``, by tag: [(step, value)], read with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder)).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_runs(root: Path, experiment: str) -> list[tuple[str, dict]]:
    """[(run name, {metric: [(step, value)]})] of an MLflow file store's experiment, newest first, read with MLflow's
    client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(root / MLFLOW_FILE_STORE).resolve().as_uri())
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"]) if found else []
    return [(run.info.run_name, {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
                                 for key in run.data.metrics}) for run in runs]


# ------------------------------------------------------------------------------------------------ the setting
def test_the_default_is_off_and_a_job_gets_a_null_tracker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = config_with()
    assert config["tracking"] == {"backends": [], "mlflow_uri": None, "wandb_project": "dpr_pipeline",
                                  "wandb_mode": "offline"}
    run = tracking_run(config, "tiny", "retriever1")
    assert isinstance(open_tracker(run), NullTracker)
    log_once(run, {"eval/test/nDCG@10": 0.5})
    assert list(tmp_path.iterdir()) == []


def test_a_backend_the_schema_does_not_know_is_refused_by_name():
    with pytest.raises(ConfigError, match="tracking"):
        config_with({"backends": ["tensorbored"]})


def test_the_jobs_param_is_left_out_of_snakemakes_params_trigger_and_survives_a_copy():
    """A change of `tracking` reruns no job: Snakemake compares only the params it can represent (builtins)."""
    from snakemake.persistence import UNREPRESENTABLE, PersistenceBase

    run = tracking_run(config_with({"backends": ["tensorboard"]}), "tiny", "retriever1")
    assert PersistenceBase._serialize_param_builtin(None, run) is UNREPRESENTABLE
    assert copy.deepcopy(run) == run                     # rebuilt from its reduce state, as the script's params are
    assert TrackingRun.from_value(json.loads(json.dumps(run.as_dict()))) == run      # through torchrun's spec
    assert run.name == "tiny/retriever1" and run.folder == Path("results/tiny/retriever1")


@pytest.mark.parametrize("backend, package", [("mlflow", "mlflow-skinny"), ("wandb", "wandb"),
                                              ("tensorboard", "tensorboard")])
def test_a_tracker_whose_package_is_missing_stops_with_the_extra_to_install(monkeypatch, backend, package):
    config = config_with({"backends": [backend]})
    check_installed(config)                                          # installed here: no error
    monkeypatch.setitem(sys.modules, backend, None)                  # Python's mark of a module that cannot import
    with pytest.raises(ConfigError) as error:
        check_installed(config)
    assert str(error.value).startswith(f"config key tracking.backends: {backend!r} needs the package {package}")
    assert EXTRA in str(error.value)
    with pytest.raises(ConfigError, match=package):
        open_tracker(tracking_run(config, "tiny", "reranker"))


def test_scalar_names():
    assert evaluation_scalars({"test": {"nDCG@10": 0.5, "R@50": 0.9}}) == {"eval/test/nDCG@10": 0.5,
                                                                           "eval/test/R@50": 0.9}
    assert evaluation_scalars({"test": {"MRR@10": 0.25}}, "nfcorpus") == {"transfer/nfcorpus/test/MRR@10": 0.25}
    record = {"metric": "nDCG@10", "trained_score": 0.7, "start_score": 0.6, "handed_on_score": 0.7}
    assert dev_scores(record) == {"dev/nDCG@10/trained": 0.7, "dev/nDCG@10/start": 0.6,
                                  "dev/nDCG@10/handed_on": 0.7}
    assert dev_scores({"reason": "no dev split"}) == {}
    assert mlflow_key("eval/test/nDCG@10") == "eval/test/nDCG_at_10"


# ------------------------------------------------------------------------------------------- each backend
def test_tensorboard_writes_one_folder_per_stage_and_a_fresh_training_starts_it_anew(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tracking_run(config_with({"backends": ["tensorboard"]}), "tiny", "retriever1")
    for fresh, loss in ((True, 9.0), (True, 2.0)):
        tracker = open_tracker(run, fresh=fresh)
        tracker.log({"train/loss": loss}, 1)
        tracker.close()
    log_once(run, {"eval/test/nDCG@10": 0.5})
    scalars = tensorboard_scalars(tmp_path / "results/tiny/retriever1/tensorboard")
    assert scalars == {"train/loss": [(1, 2.0)], "eval/test/nDCG@10": [(0, 0.5)]}


def test_mlflow_starts_a_run_per_training_and_the_evaluation_joins_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = config_with({"backends": ["mlflow"]})
    log_once(tracking_run(config, "tiny", "bm25"), {"eval/test/nDCG@10": 0.3})     # no training: a run of its own
    run = tracking_run(config, "tiny", "reranker")
    for loss in (9.0, 2.0):                                                        # a retraining: a new run
        tracker = open_tracker(run, fresh=True)
        tracker.log({"train/loss": loss}, 1)
        tracker.close()
    log_once(run, {"eval/test/nDCG@10": 0.6})
    runs = mlflow_runs(tmp_path, "tiny")
    assert sorted(name for name, _ in runs) == ["tiny/bm25", "tiny/reranker", "tiny/reranker"]
    assert dict(runs)["tiny/bm25"] == {"eval/test/nDCG_at_10": [(0, 0.3)]}
    newest, older = [metrics for name, metrics in runs if name == "tiny/reranker"]
    assert newest == {"train/loss": [(1, 2.0)], "eval/test/nDCG_at_10": [(0, 0.6)]}
    assert older == {"train/loss": [(1, 9.0)]}

def test_wandb_offline_keeps_the_stage_run_in_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tracking_run(config_with({"backends": ["wandb"]}), "tiny", "retriever1")
    tracker = open_tracker(run, fresh=True)
    tracker.log({"train/loss": 2.0}, 1)
    tracker.log({"train/loss": 1.0}, 2)
    tracker.close()
    folders = list((tmp_path / "results/tiny/retriever1/wandb").glob("offline-run-*-tiny-retriever1"))
    assert len(folders) == 1, list((tmp_path / "results").rglob("*"))
    # wandb 0.31 reads its offline records back only in its Go core (`wandb sync`); the protobuf records hold the
    # run's name, group, project and each logged key as plain strings
    records = (folders[0] / "run-tiny-retriever1.wandb").read_bytes()
    for text in (b"tiny/retriever1", b"dpr_pipeline", b"train/loss", b"step"):
        assert text in records, text

# ------------------------------------------------------------------------- a tiny training of two stages
def train_tiny(root: Path, stage: str, tracking: dict | None, data: Path, plm: Path) -> None:
    params = {"plm": str(plm), "learning_rate": 1e-3, "warmup_steps": 1, "batch_size": 4, "epochs": 2,
              "seed": 1, "save_steps": 100, "negatives_per_query": 3, "temperature": 0.1,
              "query_max_length": 16, "passage_max_length": 24, "min_steps": 0, "bf16": False}
    folder = root / "results" / "tiny" / stage
    train_biencoder(data / "negatives.parquet", data / "passages.arrow", data / "queries.parquet", folder / "model",
                    root / "results/tiny/checkpoints" / stage, folder / "loss_log.jsonl",
                    BiEncoderSettings.from_params(params, stage), stage=stage,
                    tracking=tracking)


@pytest.mark.slow
def test_a_tiny_training_is_tracked_per_stage_and_the_default_writes_nothing(tmp_path, monkeypatch):
    data = write_training_data(tmp_path / "data")
    plm = make_tiny_bert(tmp_path / "bert", dropout=0.0)
    tracked, default = tmp_path / "tracked", tmp_path / "default"
    for root, tracking in ((tracked, {"backends": ["tensorboard", "mlflow"]}), (default, None)):
        root.mkdir()
        monkeypatch.chdir(root)
        config = config_with(tracking)
        for stage in ("retriever1", "retriever2"):
            run = tracking_run(config, "tiny", stage)
            train_tiny(root, stage, run.as_dict(), data, plm)     # the job passes it to the trainer as JSON
            log_once(run, evaluation_scalars({"test": {"nDCG@10": 0.5, "R@50": 0.75}}))

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    tracking_files = {p for p in files(tracked) if p.startswith("results/mlruns/") or "/tensorboard/" in p}
    assert files(default) == files(tracked) - tracking_files          # off: nothing beyond the untracked run
    assert {p.split("/")[2] for p in tracking_files if "/tensorboard/" in p} == {"retriever1", "retriever2"}

    steps = list(range(1, 5))                                           # 8 queries, batches of 4, 2 epochs
    for stage in ("retriever1", "retriever2"):
        log = [json.loads(line) for line in (tracked / f"results/tiny/{stage}/loss_log.jsonl").read_text().splitlines()]
        scalars = tensorboard_scalars(tracked / f"results/tiny/{stage}/tensorboard")
        assert [step for step, _ in scalars["train/loss"]] == steps
        assert [value for _, value in scalars["train/loss"]] == pytest.approx([line["loss"] for line in log])
        assert [v for _, v in scalars["train/learning_rate"]] == pytest.approx([l["learning_rate"] for l in log])
        assert all(value > 0 for _, value in scalars["train/examples_per_second"])
        assert scalars["eval/test/nDCG@10"] == [(0, 0.5)]

    runs = dict(mlflow_runs(tracked, "tiny"))
    assert sorted(runs) == ["tiny/retriever1", "tiny/retriever2"]                 # one run per stage
    for stage in ("retriever1", "retriever2"):
        log = [json.loads(line) for line in (tracked / f"results/tiny/{stage}/loss_log.jsonl").read_text().splitlines()]
        history = runs[f"tiny/{stage}"]["train/loss"]
        assert [step for step, _ in history] == [line["step"] for line in log] == steps
        assert [value for _, value in history] == pytest.approx([line["loss"] for line in log])
        assert runs[f"tiny/{stage}"]["eval/test/nDCG_at_10"] == [(0, 0.5)]
