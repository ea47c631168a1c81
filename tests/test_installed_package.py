"""The jobs import ``dpr_pipeline`` as installed in the environment they run in; nothing edits ``sys.path``
(issue 37). The Snakefile warns when the installed package is another checkout's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, copy_repo

SCRIPTS = REPO / "workflow_scripts"

# What a workflow script does under Snakemake: its preamble *appends* Snakemake's search paths and the script's
# folder to sys.path, then the script imports _hub_offline and the package (and writes the job manifest).
SCRIPT = """
import json, os, sys
sys.path.extend({searchpaths!r})
before = list(sys.path)
import _hub_offline
import dpr_pipeline
from dpr_pipeline.orchestration.manifests import software
print(json.dumps({{"path_unchanged": sys.path == before, "file": dpr_pipeline.__file__,
                  "manifest": software()["dpr_pipeline_file"], "offline": os.environ.get("HF_HUB_OFFLINE")}}))
"""


def test_a_workflow_script_imports_the_installed_package_and_leaves_the_path_alone(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(searchpaths=[str(SCRIPTS)]))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    installed = subprocess.run([sys.executable, "-c", "import dpr_pipeline; print(dpr_pipeline.__file__)"],
                               capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.strip()
    assert result["path_unchanged"]
    assert Path(result["file"]).resolve() == Path(result["manifest"]) == Path(installed).resolve()
    assert result["offline"] == "1"


@pytest.mark.slow
def test_the_snakefile_warns_when_the_installed_package_is_another_checkouts(tmp_path):
    clone = copy_repo(tmp_path / "clone")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    message = " ".join((done.stdout + done.stderr).split())
    assert f"not from this checkout ({(clone / 'src').resolve()})" in message
    assert "Fix: `make install`" in message
