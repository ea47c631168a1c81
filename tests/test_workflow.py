"""The whole workflow on the bundled SciFact: lint, dry run, a Pyserini exact-score regression, reruns.

Reference: Pyserini's BEIR regression "bm25-flat" for SciFact (title and text in one field, k1=0.9, b=0.4):
nDCG@10 = 0.6789 on the test split (https://castorini.github.io/pyserini/2cr/beir.html).
"""

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.slow


def snakemake(workdir, *args, check=True):
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
               str(workdir), "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=workdir)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return done.stdout + done.stderr


def planned_jobs(output):
    table = output[output.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir


def test_lint_is_clean(workdir):
    assert "Congratulations, your workflow is in a good condition!" in snakemake(workdir, "--lint")


def test_dry_run_plans_every_stage(workdir):
    jobs = planned_jobs(snakemake(workdir, "-n"))
    assert jobs == {"ingest_corpus": 1, "ingest_split": 2, "bm25_index": 1, "bm25_search": 2, "bm25_negatives": 1,
                    "evaluate": 1, "plot_metrics": 1, "all": 1}


@pytest.fixture(scope="module")
def built(workdir):
    snakemake(workdir)
    return workdir / "results" / "scifact"


def test_bm25_matches_pyserini_regression(built):
    metrics = json.loads((built / "bm25" / "metrics.json").read_text())
    assert list(metrics) == ["test"]
    test = metrics["test"]
    assert test["num_queries"] == 300
    assert test["nDCG@10"] == pytest.approx(0.6789, abs=0.0005)
    assert 0.0 < test["MRR@10"] <= 1 and test["R@50"] <= test["R@1000"] <= 1


def test_outputs_and_negatives(built):
    negatives = pd.read_parquet(built / "bm25" / "negatives.parquet")
    assert len(negatives) == 809                          # every train query has a positive
    sizes = negatives["negative_ids"].map(len)
    assert sizes.max() == 30 and sizes.min() > 0
    for row in negatives.head(50).itertuples():
        assert not set(row.positive_ids) & set(row.negative_ids)
    for name in ("run_train.trec", "run_test.trec", "metrics.png"):
        assert (built / "bm25" / name).stat().st_size > 0
    assert (built / "logs" / "bm25_search_test.log").exists()
    assert (built / "benchmarks" / "bm25_index.tsv").exists()


def test_deleting_a_stage_reruns_only_that_stage(built, workdir):
    assert "Nothing to be done" in snakemake(workdir, "-n")
    shutil.rmtree(built / "bm25")
    jobs = planned_jobs(snakemake(workdir, "-n"))
    assert jobs == {"bm25_index": 1, "bm25_search": 2, "bm25_negatives": 1, "evaluate": 1, "plot_metrics": 1,
                    "all": 1}


def test_report_has_the_plot(built, workdir):
    snakemake(workdir, "results/scifact/bm25/metrics.png")
    snakemake(workdir, "--report", str(workdir / "report.zip"))
    assert (workdir / "report.zip").stat().st_size > 0
