"""The seed spread of a trained stage: its reruns' folders, and mean ± sd and margins computed by hand."""

import json

import pytest
import yaml

from dpr_pipeline.evaluation.seed_spread import (
    margin,
    seed_workdir,
    seeded_outputs,
    spread,
    write_ablation_report,
    write_report,
)

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
    (finished / "reranker" / "fused_teacher_scores.parquet").write_text("")
    (finished / "benchmarks" / "train").mkdir(parents=True)
    (finished / "benchmarks" / "train" / "distill.tsv").write_text("s\n300\n")
    (tmp_path / "data").mkdir()
    config = {"datasets": {"a": {"format": "beir", "path": "data/a", "eval_splits": ["test"],
                                 "stages": {"distill": {"epochs": 2}}}}}
    workdir = seed_workdir(tmp_path, config, "a", "distill", 7)
    copy = workdir / "results" / "a"
    # Snakemake rewrites a benchmark file in place: the rerun's timing must not land in the finished run's file
    with open(copy / "benchmarks" / "train" / "distill.tsv", "w") as rewritten:
        rewritten.write("s\n200\n")
    assert (finished / "benchmarks" / "train" / "distill.tsv").read_text() == "s\n300\n"
    assert not (copy / "distill").exists() and not (copy / "checkpoints" / "distill").exists()
    assert (copy / "reranker" / "metrics.json").stat().st_ino == (finished / "reranker" / "metrics.json").stat().st_ino
    # the teacher scored the pairs seed 42 draws: the seed's own are scored again
    assert not (copy / "reranker" / "teacher").exists() and not (copy / "reranker" / "teacher_scores.parquet").exists()
    assert not (copy / "reranker" / "fused_teacher_scores.parquet").exists()            # made from the teacher's
    assert (finished / "reranker" / "teacher_scores.parquet").exists()
    written = yaml.safe_load((workdir / "config.yaml").read_text())
    assert written["datasets"]["a"]["stages"]["distill"] == {"epochs": 2, "seed": 7}
    assert config["datasets"]["a"]["stages"]["distill"] == {"epochs": 2}          # the caller's config untouched
    assert (workdir / "data").resolve() == (tmp_path / "data").resolve()
    with pytest.raises(ValueError, match="one of"):
        seed_workdir(tmp_path, config, "a", "bm25", 7)


def test_a_mining_variant_remines_the_negatives_the_stage_trains_on(tmp_path):
    finished = tmp_path / "results" / "a"
    for stage in ("retriever1", "retriever2"):
        (finished / stage).mkdir(parents=True)
        (finished / stage / "metrics.json").write_text("{}")
    for name in ("negatives.parquet", "negatives_filter.json", "dropped_negatives_sample.jsonl", "run_train.trec"):
        (finished / "retriever1" / name).write_text("")
    (tmp_path / "data").mkdir()
    config = {"datasets": {"a": {"format": "beir", "path": "data/a", "eval_splits": ["test"],
                                 "stages": {"mining": {"retriever1": {"depth": 100}}}}}}
    workdir = seed_workdir(tmp_path, config, "a", "retriever2", 42, {"relative_margin": 0.05})
    assert workdir == finished / "seeds" / "retriever2" / "mining_relative_margin=0.05" / "seed_42"
    copy = workdir / "results" / "a"
    # Retriever₂ trains on Retriever₁'s mined negatives: those (and what their filters dropped) are mined again
    assert not any((copy / "retriever1" / name).exists()
                   for name in ("negatives.parquet", "negatives_filter.json", "dropped_negatives_sample.jsonl"))
    assert (copy / "retriever1" / "run_train.trec").exists() and not (copy / "retriever2").exists()
    assert (finished / "retriever1" / "negatives.parquet").exists()
    stages = yaml.safe_load((workdir / "config.yaml").read_text())["datasets"]["a"]["stages"]
    assert stages["mining"] == {"retriever1": {"depth": 100, "relative_margin": 0.05}}
    assert stages["retriever2"] == {"seed": 42}
    assert config["datasets"]["a"]["stages"]["mining"] == {"retriever1": {"depth": 100}}


def test_a_settings_variant_sets_the_stage_block_and_keeps_the_mined_negatives(tmp_path):
    finished = tmp_path / "results" / "a"
    for stage in ("retriever2", "reranker", "distill"):
        (finished / stage).mkdir(parents=True)
        (finished / stage / "metrics.json").write_text("{}")
    (finished / "retriever2" / "negatives.parquet").write_text("")
    (tmp_path / "data").mkdir()
    config = {"datasets": {"a": {"format": "beir", "path": "data/a", "eval_splits": ["test"],
                                 "stages": {"distill": {"epochs": 2}}}}}
    workdir = seed_workdir(tmp_path, config, "a", "distill", 1, settings={"negatives_per_query": 15, "alpha": 0.5})
    assert workdir == finished / "seeds" / "distill" / "set_alpha=0.5_negatives_per_query=15" / "seed_1"
    copy = workdir / "results" / "a"
    assert (copy / "retriever2" / "negatives.parquet").exists() and not (copy / "distill").exists()
    stages = yaml.safe_load((workdir / "config.yaml").read_text())["datasets"]["a"]["stages"]
    assert stages["distill"] == {"epochs": 2, "seed": 1, "negatives_per_query": 15, "alpha": 0.5}
    assert "mining" not in stages
    both = seed_workdir(tmp_path, config, "a", "distill", 1, {"relative_margin": 0.1}, {"alpha": 0.5})
    assert both.parent.name == "mining_relative_margin=0.1_set_alpha=0.5"


def test_a_variant_is_read_against_the_runs_without_it_seed_by_seed(tmp_path):
    without = {42: {"dev": {"nDCG@10": 0.71}}, 1: {"dev": {"nDCG@10": 0.70}}, 2: {"dev": {"nDCG@10": 0.76}}}
    report = write_report(tmp_path / "variant", "distill", "retriever2", RUNS, BELOW, "mining_relative_margin=0.05",
                          without)
    paired = report["paired_difference_without_variant"]["dev"]["nDCG@10"]   # −0.01, +0.02, −0.02
    assert paired["mean"] == pytest.approx(-0.01 / 3) and paired["min"] == pytest.approx(-0.02)
    assert paired["sd"] == pytest.approx(0.0208167, abs=1e-6) and not paired["all_above"]
    text = (tmp_path / "variant.md").read_text()
    assert "# Seed spread of distill (mining_relative_margin=0.05) (seeds 42, 1, 2)" in text
    assert ("nDCG@10 − without mining_relative_margin=0.05 (paired by seed): -0.0033 ± 0.0208 (min -0.0200, "
            "3 seeds; not above on every seed)") in text


def test_an_ablation_row_reruns_its_pretraining_and_its_retriever_with_the_seed(tmp_path):
    finished = tmp_path / "results" / "a"
    for stage in ("bm25", "pretrain/simlm", "ablation/simlm", "ablation/none", "checkpoints/pretrain/simlm"):
        (finished / stage).mkdir(parents=True)
        (finished / stage / "metrics.json").write_text("{}")
    (tmp_path / "data").mkdir()
    config = {"datasets": {"a": {"format": "beir", "path": "data/a", "eval_splits": ["test"]}}}
    copy = seed_workdir(tmp_path, config, "a", "ablation/simlm", 7) / "results" / "a"
    assert not (copy / "ablation" / "simlm").exists() and not (copy / "pretrain" / "simlm").exists()
    assert not (copy / "checkpoints" / "pretrain" / "simlm").exists()
    assert (copy / "ablation" / "none" / "metrics.json").exists() and (copy / "bm25").exists()
    written = yaml.safe_load((tmp_path / "results/a/seeds/ablation/simlm/seed_7/config.yaml").read_text())
    assert written["datasets"]["a"]["stages"] == {"retriever": {"seed": 7}, "pretrain": {"seed": 7}}
    assert seeded_outputs("ablation/none") == {"ablation/none": "retriever"}   # the plm as is: Retriever₁ alone
    with pytest.raises(ValueError, match="ablation/<method>"):
        seeded_outputs("pretrain/simlm")


def test_the_ablation_report_reads_each_row_against_none_and_mlm_seed_by_seed(tmp_path):
    def row(*values):
        return {seed: {"dev": {"nDCG@10": v, "num_queries": 81}} for seed, v in zip((42, 1, 2), values)}

    runs = {"none": row(0.70, 0.71, 0.72), "mlm": row(0.69, 0.71, 0.73), "simlm": row(0.72, 0.74, 0.73)}
    report = write_ablation_report(tmp_path / "seeds", runs)
    simlm = report["paired_difference"]["simlm"]
    # simlm − none: 0.02, 0.03, 0.01; − mlm: 0.03, 0.03, 0.00 (not above on seed 2)
    assert simlm["none"]["dev"]["nDCG@10"]["mean"] == pytest.approx(0.02)
    assert simlm["none"]["dev"]["nDCG@10"]["sd"] == pytest.approx(0.01)
    assert simlm["none"]["dev"]["nDCG@10"]["all_above"]
    assert simlm["mlm"]["dev"]["nDCG@10"]["mean"] == pytest.approx(0.02)
    assert not simlm["mlm"]["dev"]["nDCG@10"]["all_above"]
    assert set(report["paired_difference"]["none"]) == {"mlm"} and set(report["paired_difference"]["mlm"]) == {"none"}
    text = (tmp_path / "seeds.md").read_text()
    assert "| simlm | 0.7300 ± 0.0100 | 42: 0.7200, 1: 0.7400, 2: 0.7300 | +0.0200 ± 0.0100 ✓ | +0.0200 ± 0.0173 |" in text
    assert "| none | 0.7100 ± 0.0100 | 42: 0.7000, 1: 0.7100, 2: 0.7200 | – | +0.0000 ± 0.0100 |" in text
