"""`make install TORCH_CUDA=<cuXYZ>` (docs/cluster.md, Software): constraints.txt's torch version as the PyTorch
index's build for that CUDA release, for a driver older than PyPI's torch needs. (`pip install torch==<version>
--index-url .../cu126` after `make install` says "Requirement already satisfied" and does nothing: the same version
string; the build's local version, `+cu126`, is another.)"""

import base64
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

TORCH_INDEX = "https://download.pytorch.org/whl"
PIN = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE).group(1)


def install_commands(*variables: str) -> list[str]:
    """The commands `make install` runs with ``variables`` (make -n, the venv taken as installed), as typed in a shell:
    not as a sub-make of the `make test` running this test (whose MAKEFLAGS would add "Entering directory" lines)."""
    shell = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-n", "-s", "-o", ".venv/.installed", "install", *variables], cwd=REPO,
                          capture_output=True, text=True, check=True, env=shell)
    return done.stdout.splitlines()


def test_make_install_asks_the_cuda_build_of_the_pinned_torch_only_when_told():
    assert install_commands() == []
    command, = install_commands("TORCH_CUDA=cu126")
    assert shlex.split(command)[1:] == ["-m", "pip", "install", "-c", "constraints.txt", f"torch=={PIN}+cu126",
                                        "--extra-index-url", f"{TORCH_INDEX}/cu126"]


def resolved(command: list[str], report: Path) -> dict:
    """What pip would install for ``command`` (a `pip install`), as `--dry-run --report`: nothing installed."""
    done = subprocess.run([sys.executable, *command[1:], "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                           "--retries", "1", "--report", str(report)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    torch, = json.loads(report.read_text())["install"]
    assert (torch["metadata"]["name"], torch["metadata"]["version"]) == ("torch", f"{PIN}+cu126")
    return torch


def stand_in_index(root: Path, version: str) -> Path:
    """A folder pip reads as a package index (PEP 503) holding one wheel, ``torch==<version>`` (metadata only)."""
    info, wheel_name = f"torch-{version}.dist-info", f"torch-{version}-py3-none-any.whl"
    files = {"torch/__init__.py": b"",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for path, data in files.items()] + [f"{info}/RECORD,,"]
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text(f'<a href="{wheel_name.replace("+", "%2B")}">{wheel_name}</a>\n')
    with zipfile.ZipFile(root / "torch" / wheel_name, "w") as wheel:
        for path, data in {**files, f"{info}/RECORD": "\n".join(record).encode() + b"\n"}.items():
            wheel.writestr(path, data)
    return root


def test_the_cuda_build_resolves_under_the_constraints_pin(tmp_path):
    """The Makefile's command, its PyTorch index replaced by a stand-in holding the +cu126 build: constraints.txt's
    `torch==<version>` takes the local version (the build), so pip resolves it and keeps the pin."""
    command = shlex.split(install_commands("TORCH_CUDA=cu126")[0])
    index = stand_in_index(tmp_path / "index", f"{PIN}+cu126")
    command[command.index(f"{TORCH_INDEX}/cu126")] = index.as_uri()
    torch = resolved(command, tmp_path / "report.json")
    assert torch["download_info"]["url"].startswith(index.as_uri())


@pytest.mark.skipif(sys.platform != "linux", reason="the PyTorch index builds CUDA wheels for Linux and Windows")
def test_the_cuda_build_resolves_from_the_pytorch_index(tmp_path):
    """The Makefile's own command against the PyTorch index: pip resolves the build (reading the wheel's metadata,
    which the index serves beside it) and installs nothing."""
    try:
        urllib.request.urlopen(f"{TORCH_INDEX}/cu126/torch/", timeout=10).close()
    except OSError as error:
        pytest.skip(f"{TORCH_INDEX} cannot be reached from here ({error}): the resolution is not checked")
    torch = resolved(shlex.split(install_commands("TORCH_CUDA=cu126")[0]), tmp_path / "report.json")
    assert torch["download_info"]["url"].startswith(f"{TORCH_INDEX}/")
