"""The one place paths are built (src/dpr_pipeline/layout.py): patterns for rules, concrete files for code."""

from dpr_pipeline import layout


def test_paths_are_rule_patterns_by_default_and_concrete_files_when_given_values():
    assert layout.log_file("bm25_search_{split}") == "results/{dataset}/logs/bm25_search_{split}.log"
    assert layout.benchmark_file("train_reranker", "nq") == "results/nq/benchmarks/train_reranker.tsv"
    assert layout.data_file("qrels_test.parquet", "scifact") == "results/scifact/data/qrels_test.parquet"
    assert layout.stage_file("{stage}", "model") == "results/{dataset}/{stage}/model"
    assert layout.stage_file("retriever1", "run_test.trec", "{target}") == "results/{target}/retriever1/run_test.trec"
    assert layout.dataset_file("summary.json", "msmarco") == "results/msmarco/summary.json"
    assert layout.checkpoint_dir("distill") == "results/{dataset}/checkpoints/distill"
    assert layout.dataset_dir() == f"{layout.RESULTS}/{{dataset}}"
    assert layout.model_dir("{stage}") == "results/{dataset}/{stage}/model"
    assert layout.release_dir("ablation/simlm", "nq") == "results/nq/ablation/simlm/release"


def test_the_rules_name_no_results_path_by_hand():
    """Every results/ path of the workflow comes from layout.py (comments aside)."""
    from conftest import REPO

    for rules in sorted((REPO / "rules").glob("*.smk")):
        code = [line for line in rules.read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if '"results/' in line or "'results/" in line], rules.name
