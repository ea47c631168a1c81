"""`make gpu-check` (scripts/gpu_check.py): one report of the node, the gpu tests and the benchmarks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the check would run")
def test_without_a_gpu_the_check_stops_saying_how_to_run_it(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path / "report.md")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and not (tmp_path / "report.md").exists()
    assert "torch sees no CUDA device" in done.stderr and "Fix: run it inside a GPU job" in done.stderr


@pytest.mark.slow
def test_the_smoke_run_writes_one_report_of_tests_and_benchmarks(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--allow-cpu", "--smoke", "--output",
                           str(tmp_path / "report.md")], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "report.json").read_text())
    assert results["tests"]["ok"] and results["tests"]["tests"] >= 1
    assert set(results["benchmarks"]) == {"encode", "pretrain", "finetune"}
    assert all(b["ok"] and b["throughput"] > 0 for b in results["benchmarks"].values())
    report = (tmp_path / "report.md").read_text()
    assert "| encode |" in report and "passages/s" in report and "`pytest -m gpu`" in report
