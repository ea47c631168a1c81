"""The seed spread of a trained stage: its reruns' folders, and mean ± sd and margins computed by hand."""

import json

import pytest
import yaml

from dpr_pipeline.seed_spread import margin, seed_workdir, spread, write_report

RUNS = {42: {"dev": {"nDCG@10": 0.70, "num_queries": 81}}, 1: {"dev": {"nDCG@10": 0.72, "num_queries": 81}},
        2: {"dev": {"nDCG@10": 0.74, "num_queries": 81}}}
BELOW = {"dev": {"nDCG@10": 0.69, "num_queries": 81}}


def test_spread_is_the_mean_and_sample_sd_over_seeds():
    s = spread(RUNS)["dev"]["nDCG@10"]
    assert s["mean"] == pytest.approx(0.72) and s["sd"] == pytest.approx(0.02)     # sqrt((0.02² + 0 + 0.02²) / 2)
    assert (s["min"], s["max"], s["n"]) == (0.70, 0.74, 3)
    assert "num_queries" not in spread(RUNS)["dev"]
    assert spread({42: RUNS[42]})["dev"]["nDCG@10"]["sd"] == 0.0


def test_the_margin_over_the_stage_below_is_per_seed():
    m = margin(RUNS, BELOW, "dev", "nDCG@10")
    assert m["mean"] == pytest.approx(0.03) and m["sd"] == pytest.approx(0.02) and m["min"] == pytest.approx(0.01)
    assert m["all_above"]
    assert not margin(RUNS, {"dev": {"nDCG@10": 0.71}}, "dev", "nDCG@10")["all_above"]


def test_the_report_says_whether_every_seed_is_above(tmp_path):
    write_report(tmp_path / "spread", "distill", "retriever2", RUNS, BELOW)
    text = (tmp_path / "spread.md").read_text()
    assert "| nDCG@10 | 0.7200 ± 0.0200 | 0.7000 | 0.7400 | 0.7000 | 0.7200 | 0.7400 |" in text
    assert "nDCG@10 − retriever2: +0.0300 ± 0.0200 (min +0.0100, 3 seeds; above on every seed)" in text
    assert json.loads((tmp_path / "spread.json").read_text())["margin_over_below"]["dev"]["nDCG@10"]["n"] == 3


def test_a_rerun_folder_shares_the_finished_inputs_and_drops_the_stage_itself(tmp_path):
    finished = tmp_path / "results" / "a"
    for stage in ("retriever2", "reranker", "distill"):
        (finished / stage).mkdir(parents=True)
        (finished / stage / "metrics.json").write_text("{}")
    (finished / "checkpoints" / "distill").mkdir(parents=True)
    (finished / "reranker" / "teacher").mkdir()
    (finished / "reranker" / "teacher" / "shard_0.parquet").write_text("")
    (finished / "reranker" / "teacher_scores.parquet").write_text("")
    (tmp_path / "data").mkdir()
    config = {"datasets": {"a": {"format": "beir", "path": "data/a", "eval_splits": ["test"],
                                 "stages": {"distill": {"epochs": 2}}}}}
    workdir = seed_workdir(tmp_path, config, "a", "distill", 7)
    copy = workdir / "results" / "a"
    assert not (copy / "distill").exists() and not (copy / "checkpoints" / "distill").exists()
    assert (copy / "reranker" / "metrics.json").stat().st_ino == (finished / "reranker" / "metrics.json").stat().st_ino
    # the teacher scored the pairs seed 42 draws: the seed's own are scored again
    assert not (copy / "reranker" / "teacher").exists() and not (copy / "reranker" / "teacher_scores.parquet").exists()
    assert (finished / "reranker" / "teacher_scores.parquet").exists()
    written = yaml.safe_load((workdir / "config.yaml").read_text())
    assert written["datasets"]["a"]["stages"]["distill"] == {"epochs": 2, "seed": 7}
    assert config["datasets"]["a"]["stages"]["distill"] == {"epochs": 2}          # the caller's config untouched
    assert (workdir / "data").resolve() == (tmp_path / "data").resolve()
    with pytest.raises(ValueError, match="one of"):
        seed_workdir(tmp_path, config, "a", "bm25", 7)
