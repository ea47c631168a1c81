"""The workflow's scripts run this checkout's src/, even when another dpr_pipeline is installed (issue 15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPTS = REPO / "workflow_scripts"
SRC = REPO / "src"

# What a workflow script does under Snakemake: its preamble *appends* Snakemake's search paths and the script's
# folder to sys.path, then the script imports _library and the package (and writes the job manifest).
SCRIPT = """
import json, sys
sys.path.extend({searchpaths!r})
{before}
import _library
import dpr_pipeline
from dpr_pipeline.manifest import software
print(json.dumps({{"file": dpr_pipeline.__file__, "manifest": software()["dpr_pipeline_file"],
                  "fake": getattr(dpr_pipeline, "FAKE", False)}}))
"""


def installed_elsewhere(tmp: Path) -> Path:
    """Another ``dpr_pipeline`` (an older wheel, another checkout's install): a package folder of its own."""
    package = tmp / "site" / "dpr_pipeline"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("FAKE = True\n")
    (package / "manifest.py").write_text("def software():\n    return {'dpr_pipeline_file': 'the other one'}\n")
    return package.parent


def run_script(tmp: Path, pythonpath: list[Path], before: str = "") -> dict:
    script = tmp / "script.py"
    script.write_text(SCRIPT.format(searchpaths=[str(SCRIPTS)], before=before))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_checkout_wins_over_an_installed_package_already_ahead_on_the_path(tmp_path):
    # the other package comes first and src/ is on the path too, further back (where _library used to leave it)
    result = run_script(tmp_path, [installed_elsewhere(tmp_path), SRC])
    assert not result["fake"]
    assert Path(result["file"]).resolve() == SRC / "dpr_pipeline" / "__init__.py"
    assert result["manifest"] == str(SRC / "dpr_pipeline" / "__init__.py")


def test_a_package_imported_before_the_library_is_replaced_by_the_checkouts(tmp_path):
    result = run_script(tmp_path, [installed_elsewhere(tmp_path)], before="import dpr_pipeline; assert dpr_pipeline.FAKE")
    assert not result["fake"]
    assert result["manifest"] == str(SRC / "dpr_pipeline" / "__init__.py")
