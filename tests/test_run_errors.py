"""Under Snakemake, a run stopped by bad data or config ends with the project's message (file, line, fix), not a
traceback: a malformed corpus line in a job, a bad config value at start-up, a config error met while the job
graph is built, and a target naming a dataset or folder the config does not have (docs/bad_inputs.md)."""

import gzip
import shutil

import pytest
import yaml
from conftest import REPO, run_snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The bundled config on a copy of the bundled SciFact whose corpus line 55 is cut off mid-string."""
    workdir = tmp_path_factory.mktemp("run_errors")
    raw = workdir / "raw"
    shutil.copytree(REPO / "data" / "scifact", raw, ignore=shutil.ignore_patterns("corpus.jsonl.gz"))
    with gzip.open(REPO / "data" / "scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as corpus:
        lines = corpus.readlines()[:200]
    lines[54] = '{"_id": "broken", "text": "cut off\n'
    (raw / "corpus.jsonl").write_text("".join(lines), encoding="utf-8")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"]["scifact"]["path"] = str(raw)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir


def last_lines(done, count: int) -> list[str]:
    """The last ``count`` non-empty lines of Snakemake's log on the terminal: on stderr, or on stdout for a dry run
    (``-n``); the other stream has only the line about the profile, printed first."""
    stream = done.stdout if "-n" in done.args else done.stderr
    return [line for line in stream.splitlines() if line.strip()][-count:]


def test_a_bad_corpus_line_ends_the_run_with_its_file_line_and_fix(workdir):
    done = run_snakemake(workdir, "results/scifact/data/corpus.parquet")
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    log = workdir / "results" / "scifact" / "logs" / "ingest_corpus.log"
    head, message = last_lines(done, 2)
    assert head == f"- ingest_corpus (dataset=scifact), log {log.relative_to(workdir)}:"
    assert message == (f"  DataError: {workdir / 'raw' / 'corpus.jsonl'}, line 55: not valid JSON (Unterminated "
                       "string starting at column 27). Fix: write one complete JSON object per line")
    assert "Traceback (most recent call last)" in log.read_text() and message.strip()[11:] in log.read_text()
    assert not (workdir / "results" / "scifact" / "data" / "corpus.parquet").exists()


def test_a_target_for_a_dataset_the_config_lacks_lists_its_datasets(workdir):
    done = run_snakemake(workdir, "-n", "results/nosuch/distill/metrics.json")
    assert done.returncode == 1
    datasets = ", ".join(yaml.safe_load((workdir / "config.yaml").read_text())["datasets"])
    assert last_lines(done, 1) == [f"results/nosuch/distill/metrics.json: the config has no dataset 'nosuch'; its "
                                   f"datasets: {datasets}. Fix: name one of them (results/<dataset>/…), or declare "
                                   "'nosuch' under `datasets:` in the config"]
    assert "MissingRuleException" not in done.stdout + done.stderr


def test_a_target_under_a_folder_no_rule_writes_names_the_folders(workdir):
    done = run_snakemake(workdir, "-n", "results/scifact/retriever3/metrics.json")
    assert done.returncode == 1
    (line,) = last_lines(done, 1)
    assert line.startswith("results/scifact/retriever3/metrics.json: no rule writes under results/scifact/retriever3/")
    assert "retriever2/" in line and "distill/" in line and "Fix:" in line


def test_a_config_error_at_start_up_is_one_message(workdir):
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["datasets"]["scifact"]["unknown_qrels_ids"] = "sometimes"
    (workdir / "bad.yaml").write_text(yaml.safe_dump(config))
    done = run_snakemake(workdir, "-n", "--configfile", str(workdir / "bad.yaml"))
    assert done.returncode == 1
    assert 'File "' not in done.stdout + done.stderr and "common.smk" not in done.stdout + done.stderr
    head, message = last_lines(done, 2)
    assert head.startswith("Error in the config (") and str(workdir / "bad.yaml") in head
    assert message == ("config key datasets.scifact.unknown_qrels_ids: 'sometimes' is not one of "
                       "['error', 'warn']. Fix: use one of ['error', 'warn']")


def test_a_config_error_met_while_building_the_jobs_is_one_message(workdir):
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["datasets"]["evalonly"] = {"format": "beir", "path": str(workdir / "raw"), "eval_splits": ["test"]}
    (workdir / "evalonly.yaml").write_text(yaml.safe_dump(config))
    done = run_snakemake(workdir, "-n", "results/evalonly/retriever1/model", "--configfile",
                         str(workdir / "evalonly.yaml"))
    assert done.returncode == 1
    assert "InputFunctionException" not in done.stdout + done.stderr and 'File "' not in done.stdout + done.stderr
    (message,) = last_lines(done, 1)
    assert message.startswith("dataset 'evalonly' has no train split") and "Fix: set datasets.evalonly.train_split" \
        in message
