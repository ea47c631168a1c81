"""What a new stage, a new pre-training method and a new dataset format touch (docs/architecture.md, "Where to add
things"): each is added as the document says (its declaration in its registry, its name in the schema;
tests/scripts/additions.py), and the workflow plans it, its plots and its card take it up, and the checks that
name the other files the count includes (a test's list, a sample) fail until those are written."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, copy_repo

_SPEC = importlib.util.spec_from_file_location("additions", REPO / "tests" / "scripts" / "additions.py")
additions = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(additions)
FORMAT, METHOD, STAGE = additions.FORMAT, additions.METHOD, additions.STAGE

SCHEMA = REPO / "schemas" / "config.schema.yaml"


def edited_schema(tmp_path: Path) -> Path:
    path = tmp_path / "config.schema.yaml"
    path.write_text(additions.edit_schema(SCHEMA.read_text(encoding="utf-8")), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------- the plan


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> list[dict]:
    """The jobs of the default target, of the new method's pre-training and ablation row and of a dataset in the
    new format, planned by Snakemake in a copy of the repository whose only change is the schema's names."""
    root = tmp_path_factory.mktemp("additions")
    copy = copy_repo(root / "repo")
    (copy / "schemas" / "config.schema.yaml").write_text(edited_schema(root).read_text(encoding="utf-8"))
    toy = additions.write_toy_dataset(root / "toy")
    (root / "toy.yaml").write_text(yaml.safe_dump({"datasets": {
        "toy": {"format": FORMAT, "path": str(toy), "train_split": "train", "eval_splits": ["test"]},
        # the new stage continues from the one before it (its own block's plm, a start it declares)
        "scifact": {"stages": {STAGE: {"plm": "retriever2", "learning_rate": 1.0e-5}}}}}))
    targets = ["all", f"results/scifact/ablation/{METHOD}/metrics.json",
               f"results/scifact/pretrain/{METHOD}/loss_curve.png", "results/toy/bm25/metrics.json"]
    done = subprocess.run([sys.executable, str(REPO / "tests" / "scripts" / "additions.py"), str(copy),
                           "--configfile", str(copy / "config.yaml"), "--configfile", str(root / "toy.yaml"),
                           *targets], cwd=copy, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def jobs_of(plan: list[dict], rule: str, **wildcards) -> list[dict]:
    return [job for job in plan if job["rule"] == rule and all(job["wildcards"].get(k) == v
                                                               for k, v in wildcards.items())]


# ----------------------------------------------------------------------------------------- a new stage


def test_a_new_stage_is_trained_on_what_feeds_it_evaluated_summarised_and_plotted(plan):
    (train,) = jobs_of(plan, "train_retriever", stage=STAGE)
    assert "results/scifact/retriever2/negatives.parquet" in train["input"]      # its fed_by, no rule edited
    assert "results/scifact/retriever2/model" in train["input"]                  # its own block's plm
    assert train["params"]["retriever"]["learning_rate"] == 1.0e-5               # its own block's setting
    assert train["resources"]["gpu"] == 1 and train["conda_env"].endswith("envs/torch-gpu.yaml")
    for rule in ("encode_corpus", "build_index", "dense_search", "evaluate", "plot_metrics", "metrics_table",
                 "plot_training_loss"):
        assert any(job["wildcards"].get("stage", job["wildcards"].get("trained")) == STAGE
                   for job in jobs_of(plan, rule)), rule
    assert not jobs_of(plan, "mine_hard_negatives", stage=STAGE)                 # nothing trains on its negatives
    (summary,) = jobs_of(plan, "summary", dataset="scifact")
    assert f"results/scifact/{STAGE}/metrics.json" in summary["input"]
    assert f"results/scifact/{STAGE}/dev_selection.json" in summary["input"]
    (throughput,) = jobs_of(plan, "throughput", dataset="scifact")
    assert {"task": "training", "job": STAGE} in [{k: row[k] for k in ("task", "job")}
                                                  for row in throughput["params"]["jobs"]]


def test_a_new_stage_has_its_loss_curve_score_panel_card_text_and_seed_spread(monkeypatch, tmp_path):
    from dpr_pipeline.evaluation.seed_spread import seeded_outputs
    from dpr_pipeline.report.plots import plot_training_loss, score_panels
    from dpr_pipeline import stages

    additions.add_stage(monkeypatch)
    assert stages.trained_by("train_retriever") == ["retriever1", "retriever2", STAGE]
    log = tmp_path / "loss_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in range(1, 12)))
    plot_training_loss(log, tmp_path / "loss_curve.png", f"scifact: {stages.training_loss(STAGE)}")
    assert (tmp_path / "loss_curve.png").stat().st_size > 0
    panels = score_panels({name: f"{name}.parquet" for name in stages.mined()}, "teacher.parquet")
    assert "Retriever₂'s mined negatives (they train Retriever₃ and the re-ranker)" in panels
    assert stages.card_name(STAGE) == "Retriever₃" and "`mining.retriever2`" in stages.card_negatives(STAGE)
    assert seeded_outputs(STAGE) == {STAGE: STAGE}                             # its own block gets the seed


def test_a_stage_that_declares_no_loss_title_still_gets_a_loss_curve(monkeypatch):
    """On main before issue 37 a trained stage missing from plots.TRAINING_LOSSES stopped the default target with
    a KeyError in its plot_training_loss job."""
    from dpr_pipeline import stages

    additions.add_stage(monkeypatch)
    bare = stages.Stage("retriever4", "Retriever₄", stages.BIENCODER, "retriever", trainer="train_retriever",
                        fed_by="retriever3")
    monkeypatch.setattr(stages, "CHAIN", stages.CHAIN + (bare,))
    assert stages.training_loss("retriever4") == "Retriever₄: training loss"
    assert stages.card_negatives("retriever4") == "its training negatives"
    assert stages.mined() == ["bm25", "retriever1", "retriever2", STAGE]


def test_the_checks_that_name_a_new_stages_other_files_fail_until_they_are_written(monkeypatch, tmp_path):
    """The count's other files: the schema's transfer stages (tests/test_stages.py), the pinned lists of
    tests/test_stages.py and the planned jobs of tests/test_workflow.py, its outputs in docs/artifacts.md."""
    from dpr_pipeline import stages

    additions.add_stage(monkeypatch)
    with_model = [s.name for s in stages.CHAIN if s.kind in (stages.BIENCODER, stages.CROSS_ENCODER)]
    chain_enum = lambda schema: [name for name in yaml.safe_load(schema.read_text())["properties"]["transfer"][
        "properties"]["stages"]["items"]["enum"] if "/" not in name]
    assert chain_enum(SCHEMA) != with_model and chain_enum(edited_schema(tmp_path)) == with_model


# ----------------------------------------------------------------------------------------- a new method


def test_a_new_method_is_pretrained_and_its_ablation_row_fine_tuned_from_it(plan):
    (pretrain,) = jobs_of(plan, "pretrain", method=METHOD)
    assert pretrain["params"]["pretrain"]["method"] == METHOD
    assert not any("ngram_counts" in path for path in pretrain["input"])          # it declares no n-gram counts
    (row,) = jobs_of(plan, "train_retriever", stage=f"ablation/{METHOD}")
    assert f"results/scifact/pretrain/{METHOD}/model" in row["input"]
    assert jobs_of(plan, "plot_training_loss", trained=f"pretrain/{METHOD}")


def test_a_new_method_is_its_registry_entry_and_the_schemas_names(monkeypatch, tmp_path):
    from dpr_pipeline.pretraining.methods import METHODS, pretraining_method
    from dpr_pipeline import stages
    from dpr_pipeline.orchestration import stage_settings
    from dpr_pipeline.orchestration.config import validate_config

    additions.add_method(monkeypatch)
    assert pretraining_method(METHOD).name == METHOD
    pretrain = lambda schema: yaml.safe_load(schema.read_text())["$defs"]["pretrain"]["properties"]
    # tests/test_pretraining_methods.py fails until the schema lists it, in the registry's order
    assert pretrain(SCHEMA)["method"]["enum"] != list(METHODS)
    assert pretrain(edited_schema(tmp_path))["method"]["enum"] == list(METHODS)
    config = validate_config({"run_datasets": ["a"], "stages": {"pretrain": {"method": METHOD}}, "datasets": {"a": {
        "format": "beir", "path": "data/scifact", "train_split": "train", "eval_splits": ["test"],
        "stages": {"retriever": {"plm": "pretrain"}}}}}, edited_schema(tmp_path))
    assert stage_settings.pretraining_in_chain(config, "a") == [f"pretrain/{METHOD}"]
    assert stage_settings.initialisation(config, "a", "retriever1") == f"results/a/pretrain/{METHOD}/model"
    assert METHOD in stages.training_loss(f"pretrain/{METHOD}")


# ----------------------------------------------------------------------------------------- a new format


def test_a_dataset_in_a_new_format_is_ingested_from_the_files_it_names(plan, tmp_path):
    (corpus,) = jobs_of(plan, "ingest_corpus", dataset="toy")
    assert any(path.endswith("toy/docs.tsv") for path in corpus["input"])
    (train,) = jobs_of(plan, "ingest_split", dataset="toy", split="train")
    assert {Path(p).name for p in train["input"]} >= {"queries.train.tsv", "qrels.train.tsv"}
    assert jobs_of(plan, "evaluate", dataset="toy", stage="bm25")


def test_a_new_format_is_its_registry_entry_and_the_schemas_name(monkeypatch, tmp_path):
    import pandas as pd
    from test_ingest_formats import SAMPLES

    from dpr_pipeline.data.ingest import ingest_corpus, ingest_split
    from dpr_pipeline.data.readers import FORMATS, raw_files
    from dpr_pipeline.orchestration.config import validate_config

    additions.add_format(monkeypatch)
    toy = additions.write_toy_dataset(tmp_path / "toy")
    assert [Path(p).name for p in raw_files(FORMAT, toy) + raw_files(FORMAT, toy, "train")] == \
        ["docs.tsv", "queries.train.tsv", "qrels.train.tsv"]
    assert ingest_corpus(FORMAT, toy, tmp_path / "corpus.parquet") == 4
    ingest_split(FORMAT, toy, "train", tmp_path / "corpus.parquet", tmp_path / "q.parquet", tmp_path / "r.parquet")
    assert pd.read_parquet(tmp_path / "q.parquet")["query_id"].tolist() == ["q1", "q2"]
    dataset = {"format": FORMAT, "path": str(toy), "train_split": "train", "eval_splits": ["test"]}
    with pytest.raises(Exception, match=FORMAT):
        validate_config({"run_datasets": ["t"], "datasets": {"t": dict(dataset)}})
    validate_config({"run_datasets": ["t"], "datasets": {"t": dict(dataset)}}, edited_schema(tmp_path))
    # tests/test_ingest_formats.py requires a sample of every registered format
    assert set(SAMPLES) != set(FORMATS)
