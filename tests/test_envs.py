"""The rules' conda env files pin the same versions as pyproject.toml."""

import tomllib

import pytest
import yaml
from packaging.requirements import Requirement

from conftest import REPO

PROJECT = {Requirement(r).name: Requirement(r) for r in
           tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
ENV_FILES = sorted((REPO / "envs").glob("*.yaml"))


def pip_requirements(env_file):
    deps = yaml.safe_load(env_file.read_text())["dependencies"]
    return [Requirement(r) for d in deps if isinstance(d, dict) for r in d.get("pip", [])]


def test_there_are_env_files():
    assert {p.stem for p in ENV_FILES} >= {"data", "bm25", "eval"}


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_env_pins_match_pyproject(env_file):
    for req in pip_requirements(env_file):
        assert req.name in PROJECT, f"{env_file.name}: {req.name} is not a dependency in pyproject.toml"
        assert req.specifier == PROJECT[req.name].specifier, (
            f"{env_file.name} pins {req}, pyproject.toml {PROJECT[req.name]}")


def test_every_rule_env_exists():
    for smk in (REPO / "rules").glob("*.smk"):
        for line in smk.read_text().splitlines():
            if line.strip().startswith('"../envs/'):
                assert (REPO / "rules" / line.strip().strip('",')).resolve().is_file(), line
