"""The report's figures and tables: training loss curves, score distributions of positives vs negatives,
throughput from benchmark files, metric tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import DataError
from dpr_pipeline.report.plots import plot_score_distributions, plot_training_loss, read_loss_log, score_separation
from dpr_pipeline.report.tables import metrics_frame, write_metrics_table
from dpr_pipeline.report.throughput import COLUMNS, count_items, read_benchmark, throughput_table, write_throughput
from dpr_pipeline.stages import training_loss

PNG = b"\x89PNG\r\n\x1a\n"
NAN = float("nan")


def write_loss_log(path: Path, losses: list[float]) -> Path:
    path.write_text("".join(json.dumps({"step": i + 1, "epoch": 0, "loss": loss, "learning_rate": 1e-4 * (i + 1),
                                        "seconds": 0.5 * (i + 1)}) + "\n" for i, loss in enumerate(losses)))
    return path


def write_negatives(path: Path, rows: list[tuple]) -> Path:
    frame = pd.DataFrame(rows, columns=["query_id", "positive_ids", "positive_scores", "negative_ids",
                                        "negative_scores"])
    write_artifact(frame, path, "negatives")
    return path


def write_benchmark(path: Path, seconds: list[float], max_rss: float = 512.0) -> Path:
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    path.write_text(header + "".join(f"{s}\t0:00:{int(s):02d}\t{max_rss}\t1\t1\t1\t0\t0\t90\t{s * 0.9}\n"
                                     for s in seconds))
    return path


def test_training_loss_plot_and_titles(tmp_path: Path):
    log = write_loss_log(tmp_path / "loss_log.jsonl", [2.0, 1.8, 1.5, 1.4, 1.0, 0.9, 0.8, 0.8, 0.7, 0.6, 0.5])
    assert [row["step"] for row in read_loss_log(log)] == list(range(1, 12))
    plot_training_loss(log, tmp_path / "loss_curve.png", "scifact: " + training_loss("retriever2"))
    assert (tmp_path / "loss_curve.png").read_bytes().startswith(PNG)
    assert "Eq. 4" in training_loss("reranker") and "simlm" in training_loss("pretrain/simlm")
    assert "cdmae" in training_loss("ablation/cdmae")


@pytest.mark.parametrize("content, problem", [("", "empty"), ('{"step": 1}\n', "missing field(s) 'loss'"),
                                              ('{"step": 1, "loss": 0.5}\nnot json\n', "not valid JSON")])
def test_bad_loss_log_is_one_data_error(tmp_path: Path, content: str, problem: str):
    (tmp_path / "loss_log.jsonl").write_text(content)
    with pytest.raises(DataError, match="loss_log.jsonl") as error:
        plot_training_loss(tmp_path / "loss_log.jsonl", tmp_path / "out.png", "t")
    assert problem in str(error.value)
    assert not (tmp_path / "out.png").exists()


def test_score_separation_counts_and_the_share_of_queries_with_the_positive_first():
    frame = pd.DataFrame({
        "positive_scores": [[0.9], [0.5, NAN], [NAN], [0.7]],
        "negative_scores": [[0.8, 0.1], [0.6], [0.4], []],
    })
    scores = score_separation(frame)
    assert sorted(scores["positives"]) == [0.5, 0.7, 0.9]
    assert sorted(scores["negatives"]) == [0.1, 0.4, 0.6, 0.8]
    assert scores["unscored_positives"] == 2
    # q1: 0.9 > 0.8 yes; q2: 0.5 < 0.6 no; q3: no scored positive; q4: no negative -> 1 of 2 compared queries
    assert scores["compared_queries"] == 2 and scores["positive_first"] == 0.5


def test_score_distribution_plot_with_a_scoreless_artifact(tmp_path: Path):
    scored = write_negatives(tmp_path / "mined.parquet", [
        ("q1", ["d1"], [0.9], ["d2", "d3"], [0.7, 0.2]), ("q2", ["d4"], [NAN], ["d5"], [0.5])])
    official = write_negatives(tmp_path / "official.parquet", [("q1", ["d1"], [NAN], ["d2"], [NAN])])
    plot_score_distributions({"mined": scored, "official": official}, tmp_path / "scores.png", "scores",
                             score_names={"mined": "cosine similarity"})
    assert (tmp_path / "scores.png").read_bytes().startswith(PNG)


def test_throughput_table_rates_from_benchmarks_and_artifacts(tmp_path: Path):
    ids = tmp_path / "shard_0.ids.parquet"
    pd.DataFrame({"doc_id": [f"d{i}" for i in range(120)]}).to_parquet(ids)
    queries = tmp_path / "queries_test.parquet"
    pd.DataFrame({"query_id": ["q1", "q2", "q3"], "text": ["a", "b", "c"]}).to_parquet(queries)
    # a pair the teacher did not score (NaN: the student never draws it) is not counted
    teacher = write_negatives(tmp_path / "teacher.parquet", [("q1", ["d1"], [1.0], ["d2", "d3", "d7"],
                                                              [0.5, 0.1, float("nan")]),
                                                             ("q2", ["d4", "d5"], [1.0, 2.0], ["d6"], [0.3])])
    loss_log = write_loss_log(tmp_path / "loss_log.jsonl", [1.0] * 8)
    jobs = [
        {"task": "corpus encoding", "job": "shard 0", "unit": "passages", "counted": ids,
         "benchmark": write_benchmark(tmp_path / "encode.tsv", [10.0, 14.0], max_rss=900)},
        {"task": "dense search", "job": "test", "unit": "queries", "counted": queries,
         "benchmark": write_benchmark(tmp_path / "search.tsv", [1.5])},
        {"task": "teacher scoring", "job": "shard 0", "unit": "query-passage pairs", "counted": teacher,
         "benchmark": write_benchmark(tmp_path / "teacher.tsv", [3.0])},
        {"task": "training", "job": "retriever1", "unit": "steps", "counted": loss_log,
         "benchmark": write_benchmark(tmp_path / "train.tsv", [4.0])},
        {"task": "re-ranking", "job": "test", "unit": "queries", "counted": queries,
         "benchmark": tmp_path / "never_written.tsv"},
    ]
    table = throughput_table(jobs)
    assert list(table.columns) == COLUMNS
    assert table["items"].tolist() == [120, 3, 6, 8, 3]
    assert table["seconds"].tolist()[:4] == [12.0, 1.5, 3.0, 4.0]          # repeats: the mean
    assert table["items_per_second"].tolist()[:4] == [10.0, 2.0, 2.0, 2.0]
    assert table["max_rss_mb"].iloc[0] == 900
    assert math.isnan(table["seconds"].iloc[4]) and math.isnan(table["items_per_second"].iloc[4])

    outputs = tmp_path / "throughput.tsv", tmp_path / "throughput.html", tmp_path / "throughput.png"
    write_throughput(jobs, *outputs, "throughput")
    assert pd.read_csv(outputs[0], sep="\t")["items"].tolist() == [120, 3, 6, 8, 3]
    html = outputs[1].read_text()
    assert "<table" in html and "passages" in html and "10.00" in html and "–" in html
    assert outputs[2].read_bytes().startswith(PNG)


def test_bad_benchmark_file_is_one_data_error(tmp_path: Path):
    assert read_benchmark(tmp_path / "missing.tsv") is None
    (tmp_path / "bench.tsv").write_text("wall\n3\n")
    with pytest.raises(DataError, match=r"bench.tsv: no `s`"):
        read_benchmark(tmp_path / "bench.tsv")
    with pytest.raises(ValueError, match="unknown unit"):
        count_items(tmp_path / "bench.tsv", "bytes")


def test_metrics_table(tmp_path: Path):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"test": {"num_queries": 300, "MRR@10": 0.64567, "nDCG@10": 0.6789},
                                   "dev": {"num_queries": 20, "MRR@10": 0.5}}))
    frame = metrics_frame(metrics)
    assert frame.columns.tolist() == ["split", "queries", "MRR@10", "nDCG@10"]
    assert frame["queries"].tolist() == [300, 20]
    write_metrics_table(metrics, tmp_path / "metrics.html", "scifact: BM25 metrics")
    html = (tmp_path / "metrics.html").read_text()
    assert "scifact: BM25 metrics" in html and "0.6457" in html and "0.6789" in html and "–" in html
