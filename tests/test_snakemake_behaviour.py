"""What Snakemake (9.27) does where the workflow works around it, each on a workflow of its own: a test here fails
when a Snakemake release changes the behaviour, so that the workaround is dropped or moved with it.

- A deleted intermediate file is not rebuilt while the target is up to date (snakemake/snakemake#1978; no
  ``--rerun-triggers`` covers it): ``orchestration/deleted_inputs.py`` marks such files as forced.
- A rule's ``restart_times`` set in ``onstart`` is its retries for that run (a rule's ``retries:`` is fixed when
  the workflow is read, before the plan and ``--retries`` are known): ``rules/common.smk`` sets the training rules'
  continuations there.
- The error Snakemake logs as it stops is a record carrying ``exception``, after ``onerror``: the project's
  ``run_errors.LastLines`` filter rewrites it into the failed jobs' messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def snakemake(folder: Path, snakefile: str, *args: str) -> subprocess.CompletedProcess:
    (folder / "Snakefile").write_text(snakefile)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=folder, env=env,
                          capture_output=True, text=True)


CHAIN = """
rule c:
    input: "b.txt"
    output: "c.txt"
    shell: "cat {input} > {output}"

rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} > {output}"
"""


def test_snakemake_does_not_rebuild_a_deleted_intermediate_file_of_an_up_to_date_target(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    assert snakemake(tmp_path, CHAIN, "c.txt").returncode == 0
    (tmp_path / "b.txt").unlink()
    planned = snakemake(tmp_path, CHAIN, "-n", "c.txt")
    assert "Nothing to be done" in planned.stdout + planned.stderr, (
        "Snakemake now rebuilds a deleted intermediate: drop orchestration/deleted_inputs.py")


def test_restart_times_set_in_onstart_are_the_rule_s_retries(tmp_path):
    flaky = """
onstart:
    workflow.get_rule("flaky").restart_times = 2

rule flaky:
    output: "done.txt"
    shell: "echo x >> attempts.txt; test $(wc -l < attempts.txt) -ge 3 && touch {output}"
"""
    done = snakemake(tmp_path, flaky, "done.txt")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "attempts.txt").read_text().count("x") == 3


def test_the_error_snakemake_stops_with_is_a_record_the_last_lines_filter_rewrites(tmp_path):
    failing = """
from snakemake.logging import logger
from dpr_pipeline.orchestration.run_errors import LastLines

LAST_LINES = LastLines.install(logger, lambda error: None)

onerror:
    LAST_LINES.report = "the workflow's own last lines"

rule fail:
    output: "x.txt"
    shell: "exit 3"
"""
    done = snakemake(tmp_path, failing, "x.txt")
    assert done.returncode != 0
    assert (done.stdout + done.stderr).rstrip().splitlines()[-1] == "the workflow's own last lines"
