"""Running the workflow from another folder (issue 52): the bundled config.yaml is read wherever snakemake runs
(then a config.yaml of the working directory, as Snakemake reads one, and each --configfile), and a dataset's
raw files missing from the working directory (``--directory`` moved it away from them) get one message naming
the file, where it is and the fix instead of Snakemake's ``MissingInputException`` (docs/datasets.md, "Running
from another folder"; src/dpr_pipeline/orchestration/run_folders.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import REPO, write_beir

from dpr_pipeline.orchestration.run_folders import missing_raw_files, working_directory_config

MISSING = """Missing input files for rule ingest_corpus:
    output: results/mine/data/corpus.parquet
    wildcards: dataset=mine
    affected files:
        data/mine/corpus.jsonl"""

MINE = {"mine": {"format": "beir", "path": "data/mine", "train_split": "train", "eval_splits": ["test"]}}


def test_a_working_directory_config_is_read_after_the_bundled_one_unless_it_is_that_one(tmp_path):
    checkout, work = tmp_path / "checkout", tmp_path / "work"
    checkout.mkdir(), work.mkdir()
    (checkout / "config.yaml").write_text("datasets: {}\n")
    assert working_directory_config(checkout, work) is None                    # no config.yaml here
    (work / "config.yaml").write_text("datasets: {}\n")
    assert working_directory_config(checkout, work) is None                    # a copy of the bundled one
    (work / "config.yaml").write_text("run_datasets: [mine]\n")
    assert working_directory_config(checkout, work) == work / "config.yaml"
    assert working_directory_config(work, work) is None                        # it is the bundled one


def test_raw_files_left_behind_by_directory_are_named_with_where_they_are(tmp_path):
    started, work = tmp_path / "started", tmp_path / "work"
    write_beir(started / "data" / "mine")
    work.mkdir()
    message = missing_raw_files(MISSING, MINE, work, started)
    assert message == (f"data/mine/corpus.jsonl: a raw file of dataset 'mine' (`path: data/mine`) is missing from "
                       f"the working directory {work}, which every relative path in the config is read from; the "
                       f"folder is {started / 'data' / 'mine'}, in the folder snakemake was started in (--directory "
                       f"moved the working directory). Fix: write the dataset's path as an absolute path (`datasets: "
                       f"{{mine: {{path: {started / 'data' / 'mine'}}}}}` in your --configfile), or run snakemake in "
                       f"{started} without --directory (docs/datasets.md, Running from another folder)")
    # nowhere to be found: the fix is to put them there or point `path` at them
    alone = missing_raw_files(MISSING, MINE, work, work)
    assert alone.endswith("Fix: put the dataset's files there, or set the dataset's `path` to the folder that holds "
                          "them (an absolute path is read from anywhere; docs/datasets.md, Running from another "
                          "folder)")
    # the bundled data, from another folder: it is in the checkout
    checkout = tmp_path / "checkout"
    write_beir(checkout / "data" / "mine")
    assert f"the folder is {checkout / 'data' / 'mine'}, in the workflow's checkout" in missing_raw_files(
        MISSING, MINE, work, work, checkout)


def test_other_missing_files_keep_snakemakes_message(tmp_path):
    absolute = {"mine": {**MINE["mine"], "path": str(tmp_path / "data" / "mine")}}
    assert missing_raw_files(MISSING, absolute, tmp_path, tmp_path) is None       # an absolute path: not ours
    other = MISSING.replace("data/mine/corpus.jsonl", "results/mine/bm25/run_test.trec")
    assert missing_raw_files(other, MINE, tmp_path, tmp_path) is None
    assert missing_raw_files("Missing input files", MINE, tmp_path, tmp_path) is None


# ------------------------------------------------------------------------------------------------ Snakemake
def snakemake(cwd, *args):
    return subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "1",
                           "-n", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_from_another_folder_the_bundled_config_is_read_and_directory_names_its_fix(tmp_path):
    """`snakemake -s <checkout>/Snakefile` from another folder reads the bundled config.yaml (its `scifact` entry
    plans, completed only by an absolute `path` here); `--directory` away from the data the config names gives the
    one message with the fix; a config.yaml of the working directory is read after the bundled one."""
    started = tmp_path / "started"
    write_beir(started / "data" / "mine")
    (started / "my.yaml").write_text(yaml.safe_dump({"datasets": {
        **MINE, "scifact": {"path": str(REPO / "data" / "scifact")}}, "run_datasets": ["mine"]}))
    done = snakemake(started, "--configfile", "my.yaml", "--", "results/scifact/bm25/metrics.json",
                     "results/mine/bm25/metrics.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"input: {REPO / 'data' / 'scifact' / 'corpus.jsonl.gz'}" in done.stdout   # the bundled entry, read
    assert "input: data/mine/corpus.jsonl" in done.stdout

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = snakemake(started, "--directory", str(elsewhere), "--configfile", "my.yaml", "--",
                     "results/mine/bm25/metrics.json")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "MissingInputException" not in output and "Traceback" not in output, output[-3000:]
    assert ("data/mine/corpus.jsonl: a raw file of dataset 'mine' (`path: data/mine`) is missing from the working "
            f"directory {elsewhere}") in output, output[-3000:]
    assert output.count(". Fix: ") == 1 and f"(`datasets: {{mine: {{path: {started / 'data' / 'mine'}}}}}`" in output

    # a config.yaml of the working directory is read too, after the bundled one (Snakemake's convention), logged
    (started / "my.yaml").rename(started / "config.yaml")
    done = snakemake(started, "--", "results/scifact/bm25/metrics.json", "results/mine/bm25/metrics.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (f"Reading {started / 'config.yaml'} (the working directory's config.yaml) after the bundled "
            f"{REPO / 'config.yaml'}") in done.stdout + done.stderr
    assert "input: data/mine/corpus.jsonl" in done.stdout
