"""Deleting a file reruns the job that writes it and what is built on it, for any target, nothing upstream
(dpr_pipeline.orchestration.deleted_inputs), on a four-rule workflow; tests/test_workflow.py checks the real chain."""

import subprocess
import sys

import pytest
from conftest import planned_jobs

from dpr_pipeline.orchestration.deleted_inputs import deleted_inputs

SNAKEFILE = """
from dpr_pipeline.orchestration.deleted_inputs import rerun_deleted_inputs

rule all:
    input: "stage2.txt", "side.txt"

rule stage0:
    output: "stage0.txt"
    shell: "echo 0 > {output}"

rule stage1:
    input: "stage0.txt"
    output: model="stage1.model", run="stage1.run"
    shell: "cat {input} > {output.model}; cat {input} > {output.run}"

rule stage2:
    input: "stage1.model"
    output: "stage2.txt"
    shell: "cat {input} > {output}"

rule side:
    input: "stage0.txt"
    output: "side.txt"
    shell: "cat {input} > {output}"

rerun_deleted_inputs(workflow)
"""


def snakemake(workdir, *args):
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=workdir,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture
def finished(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    snakemake(tmp_path)
    assert "Nothing to be done" in snakemake(tmp_path, "-n")
    return tmp_path


def test_deleted_inputs_lists_what_is_gone_only_where_the_outputs_exist(tmp_path):
    (tmp_path / "in").write_text("")
    (tmp_path / "out").write_text("")
    gone, kept, out = str(tmp_path / "gone"), str(tmp_path / "in"), str(tmp_path / "out")
    assert deleted_inputs([kept, gone, gone], [out]) == [gone]
    assert deleted_inputs([kept], [out]) == []
    assert deleted_inputs([gone], [out, str(tmp_path / "missing_output")]) == []


def test_deleting_part_of_a_stage_reruns_it_and_what_depends_on_it(finished):
    (finished / "stage1.model").unlink()
    assert planned_jobs(snakemake(finished, "-n", "stage2.txt")) == {"stage1": 1, "stage2": 1}
    snakemake(finished, "stage2.txt")
    assert "Nothing to be done" in snakemake(finished, "-n")


def test_a_deleted_file_the_target_does_not_need_reruns_nothing(finished):
    (finished / "stage1.run").unlink()
    assert "Nothing to be done" in snakemake(finished, "-n", "side.txt")
    (finished / "stage0.txt").unlink()
    assert planned_jobs(snakemake(finished, "-n", "side.txt")) == {"stage0": 1, "side": 1}
