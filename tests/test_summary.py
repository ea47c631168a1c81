"""The per-dataset summary of every stage's metrics (the paper's Table 6 layout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.summary import write_summary

STAGE_METRICS = {
    "bm25": {"dev": {"num_queries": 3, "MRR@10": 0.18400, "R@1000": 0.853}},
    "retriever1": {"dev": {"num_queries": 3, "MRR@10": 0.38012, "R@1000": 0.98}},
    "retriever2": {"dev": {"num_queries": 3, "MRR@10": 0.39, "R@1000": 0.986},
                   "trec_dl19": {"num_queries": 2, "nDCG@10": 0.71}},
    "reranker": {"dev": {"num_queries": 3, "MRR@10": 0.437, "R@1000": 0.986}},
    "distill": {"dev": {"num_queries": 3, "MRR@10": 0.411, "R@1000": 0.987}},
}


def write_metrics(folder: Path) -> dict[str, str]:
    paths = {}
    for stage, metrics in STAGE_METRICS.items():
        paths[stage] = str(folder / stage / "metrics.json")
        Path(paths[stage]).parent.mkdir(parents=True)
        Path(paths[stage]).write_text(json.dumps(metrics))
    return paths


def test_summary_json_markdown_and_png(tmp_path: Path):
    outputs = tmp_path / "summary.json", tmp_path / "summary.md", tmp_path / "summary.png"
    write_summary(write_metrics(tmp_path), *outputs, labels={"distill": "Distilled"})

    summary = json.loads(outputs[0].read_text())
    assert list(summary) == ["dev", "trec_dl19"]
    assert list(summary["dev"]) == list(STAGE_METRICS)
    assert summary["dev"]["reranker"]["MRR@10"] == pytest.approx(0.437)
    assert summary["trec_dl19"] == {"retriever2": {"num_queries": 2, "nDCG@10": 0.71}}

    markdown = outputs[1].read_text()
    assert "## dev (3 queries)\n\n| stage | MRR@10 | R@1000 |\n| --- | ---: | ---: |\n" in markdown
    assert "| BM25 | 0.1840 | 0.8530 |\n| Retriever₁ | 0.3801 | 0.9800 |\n| Retriever₂ | 0.3900 | 0.9860 |\n" \
           "| Re-ranker | 0.4370 | 0.9860 |\n| Distilled | 0.4110 | 0.9870 |" in markdown
    assert "## trec_dl19 (2 queries)\n\n| stage | nDCG@10 |\n| --- | ---: |\n| Retriever₂ | 0.7100 |" in markdown
    assert outputs[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_metric_shows_a_dash_and_differing_query_counts_are_listed(tmp_path: Path):
    paths = {"bm25": tmp_path / "bm25.json", "reranker": tmp_path / "reranker.json"}
    paths["bm25"].write_text(json.dumps({"test": {"num_queries": 4, "nDCG@10": 0.5, "R@100": 0.75}}))
    paths["reranker"].write_text(json.dumps({"test": {"num_queries": 3, "nDCG@10": 0.625}}))
    write_summary(paths, tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png", labels=None)
    markdown = (tmp_path / "s.md").read_text()
    assert "## test (queries: BM25 4, Re-ranker 3)" in markdown
    assert "| Re-ranker | 0.6250 | – |" in markdown


def test_missing_metrics_file_is_a_data_error_and_writes_nothing(tmp_path: Path):
    outputs = tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png"
    with pytest.raises(DataError, match="metrics file not found"):
        write_summary({"bm25": str(tmp_path / "absent.json")}, *outputs)
    assert not any(path.exists() for path in outputs)


def test_each_stage_is_compared_with_the_stage_below_it_query_by_query(tmp_path: Path):
    """summary.md and summary.json carry the paired difference of each stage from the one it improves on
    (retriever1 - start, reranker - retriever2, ...), from metrics.json's per_query values."""
    per_query = {"start": [0.2, 0.4, 0.6, 0.8], "retriever1": [0.3, 0.5, 0.7, 0.9],   # +0.1 on every query
                 "retriever2": [0.3, 0.5, 0.7, 1.0], "reranker": [0.4, 0.4, 0.8, 0.9]}
    paths = {}
    for stage, values in per_query.items():
        paths[stage] = tmp_path / f"{stage}.json"
        paths[stage].write_text(json.dumps({
            "test": {"num_queries": 4, "nDCG@10": sum(values) / 4},
            "per_query": {"test": {"nDCG@10": {f"q{i}": v for i, v in enumerate(values)}}}}))
    write_summary(paths, tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png")

    written = json.loads((tmp_path / "s.json").read_text())
    assert list(written) == ["test", "paired_differences"]
    compared = written["paired_differences"]["test"]
    assert list(compared) == ["retriever1", "retriever2", "reranker"]          # start has no stage below
    assert compared["retriever1"]["below"] == "start"
    assert compared["retriever1"]["nDCG@10"]["mean"] == pytest.approx(0.1)
    assert compared["retriever1"]["nDCG@10"]["p_value"] == 0.0                # the same gain on every query
    reranker = compared["reranker"]
    assert reranker["below"] == "retriever2" and (reranker["nDCG@10"]["wins"], reranker["nDCG@10"]["losses"]) == (2, 2)
    assert reranker["nDCG@10"]["mean"] == pytest.approx(0.0)

    markdown = (tmp_path / "s.md").read_text()
    assert "paired over the 4 queries" in markdown
    assert "| Retriever₁ | Starting model (untrained) | +0.1000 ± 0.0000 † |" in markdown
    assert "| Re-ranker | Retriever₂ | +0.0000 ± " in markdown and markdown.count("†") == 2   # legend + retriever1


def test_metrics_of_stages_on_different_queries_are_not_compared_silently(tmp_path: Path):
    paths = {}
    for stage, queries in (("retriever1", ["q1", "q2"]), ("retriever2", ["q1", "q3"])):
        paths[stage] = tmp_path / f"{stage}.json"
        paths[stage].write_text(json.dumps({"test": {"num_queries": 2, "nDCG@10": 0.5},
                                            "per_query": {"test": {"nDCG@10": dict.fromkeys(queries, 0.5)}}}))
    with pytest.raises(DataError, match="retriever2.json.*split 'test' against .*retriever1.json.*different queries"):
        write_summary(paths, tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png")
    assert not (tmp_path / "s.json").exists()


def test_the_verdict_names_a_stage_not_above_the_stage_below_it_and_the_chain_against_its_start(tmp_path: Path, caplog):
    """A user's small collection: Retriever₁ below its start on dev, the distilled retriever below the start; the
    summary and the log say so in words (nDCG@10, the headline metric, though MRR@10 comes first)."""
    values = {"bm25": 0.50, "start": 0.60, "retriever1": 0.58, "retriever2": 0.61, "reranker": 0.65, "distill": 0.585}
    paths = {}
    for stage, value in values.items():
        paths[stage] = tmp_path / f"{stage}.json"
        paths[stage].write_text(json.dumps({"dev": {"num_queries": 5, "MRR@10": 0.9, "nDCG@10": value}}))
    with caplog.at_level("INFO", logger="dpr_pipeline.evaluation.summary"):
        write_summary(paths, tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png")
    markdown = (tmp_path / "s.md").read_text()
    assert ("**Not above the stage below (nDCG@10):** Retriever₁ -0.0200 against Starting model (untrained); "
            "Retriever_distill -0.0250 against Retriever₂.") in markdown
    assert "Retriever_distill ends -0.0150 nDCG@10 against Starting model (untrained): NOT above" in markdown
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "Retriever₁ -0.0200" in warnings[0].getMessage()


def test_the_verdict_when_every_stage_is_above_the_one_below_it(tmp_path: Path):
    paths = write_metrics(tmp_path)       # no nDCG@10: the verdict reads the split's first metric, MRR@10
    write_summary(paths, tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png")
    markdown = (tmp_path / "s.md").read_text()
    assert ("Every trained stage is above the stage below it on MRR@10 (Retriever₂ +0.0099, Re-ranker +0.0470, "
            "Retriever_distill +0.0210).") in markdown
    assert "ends" not in markdown          # no starting model in this summary


def test_what_each_trained_stage_handed_on_is_said_in_the_summary_and_the_log(tmp_path: Path, caplog):
    """A stage whose start went on (Retriever₂ below Retriever₁ on dev; the re-ranker's fusion weight 0) is said
    so in words, in the Markdown, the JSON and as a warning in the log."""
    scored = {"split": "dev", "metric": "nDCG@10", "depth": 1000, "relevance_level": 1, "query_max_length": 64,
              "passage_max_length": 256, "searched": {"queries": 40, "passages": 812}, "start_score_from": "here",
              "paired": {"queries": 40, "mean": 0.01, "ci95": 0.02, "p_value": 0.3, "wins": 10, "losses": 8},
              "resolved": False}
    selections = {
        "retriever1": {"stage": "Retriever₁", "start": "Starting model (untrained)", "start_model": "pkg:m",
                       "handed_on": "trained", "trained_score": 0.71, "start_score": 0.70, "difference": 0.01,
                       "handed_on_score": 0.71, **scored},
        "retriever2": {"stage": "Retriever₂", "start": "Retriever₁", "start_model": "results/a/retriever1/model",
                       "handed_on": "start", "trained_score": 0.705, "start_score": 0.71, "difference": -0.005,
                       "handed_on_score": 0.71, **scored},
    }
    paths = {}
    for stage, record in selections.items():
        paths[stage] = tmp_path / f"{stage}.json"
        paths[stage].write_text(json.dumps(record))
    fusion = tmp_path / "fusion_weight.json"
    fusion.write_text(json.dumps({"weight": 0.0, "metric": "nDCG@10", "split": "dev", "depth": 30,
                                  "values": {"0": 0.71, "0.5": 0.70, "1": 0.69}}))
    outputs = tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png"
    with caplog.at_level("INFO"):
        write_summary(write_metrics(tmp_path), *outputs, selections=paths, fusion_choice=fusion)
    markdown = outputs[1].read_text()
    assert "## What each trained stage handed on (chosen on the dev split)" in markdown
    assert "* Retriever₁ is above its start (Starting model (untrained)) on dev (+0.0100 nDCG@10 over its 40 " \
           "queries, each searched in the whole corpus of 812 passages; 95 % interval ±0.0200): the trained model " \
           "was handed on. The 40 dev queries do not resolve this difference (paired t-test, 95 %): a larger dev " \
           "split would (dev_split.fraction, docs/datasets.md)." in markdown
    assert "* Retriever₂ is not above its start (Retriever₁) on dev (-0.0050 nDCG@10 over its 40 queries, each " \
           "searched in the whole corpus of 812 passages; 95 % interval ±0.0200): its start was handed on." in markdown
    assert "* Re-ranker did not beat its start (Retriever₂) on dev (at best -0.0100 nDCG@10): Retriever₂'s order " \
           "was handed on (fusion weight 0)." in markdown
    assert markdown.index("Retriever₂ is not above") < markdown.index("Re-ranker did not")  # pipeline order
    assert list(json.loads(outputs[0].read_text())["dev_selection"]) == ["retriever1", "retriever2", "reranker"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m.startswith("Retriever₂ is not above its start") for m in warnings)
    assert any(m.startswith("Re-ranker did not beat its start") for m in warnings)
    assert not any(m.startswith("Retriever₁") for m in warnings)
