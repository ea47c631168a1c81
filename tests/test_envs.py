"""The rules' conda env files pin the same versions as pyproject.toml, and hold what their jobs import."""

import ast
import json
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest
import yaml
from conftest import REPO
from packaging.requirements import Requirement

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


# The packages a job can import only where its conda env installs them (import names), and what each env adds;
# a pip name's own dependencies count as its env's (pyserini brings transformers, transformers huggingface_hub).
OPTIONAL_IMPORTS = {"torch", "transformers", "sentence_transformers", "faiss", "huggingface_hub", "ir_measures",
                    "pytrec_eval", "matplotlib", "scipy", "pyserini", "jnius", "ir_datasets", "jsonschema"}
ENV_IMPORTS = {
    "data": {"jsonschema", "ir_datasets", "huggingface_hub"},
    "eval": {"ir_measures", "pytrec_eval", "matplotlib", "scipy"},
    "bm25": {"pyserini", "jnius", "faiss", "torch", "transformers", "huggingface_hub", "scipy"},
    "torch": {"torch", "transformers", "sentence_transformers", "faiss", "huggingface_hub", "scipy", "jsonschema"},
}
RULE = re.compile(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", re.M | re.S)


def rule_scripts():
    """(rule, env name, script) for every rule that runs a workflow script in a conda env."""
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for name, body in RULE.findall(smk.read_text()):
            env = re.search(r"conda:\s*\n\s*(?:\"\.\./envs/([\w-]+)\.yaml\"|torch_env\()", body)
            script = re.search(r"script:\s*\n\s*\"\.\./(workflow_scripts/\w+\.py)\"", body)
            if env and script:
                yield name, (env.group(1) or "torch").replace("torch-gpu", "torch"), script.group(1)


RULE_SCRIPTS = list(rule_scripts())


@pytest.fixture(scope="module")
def import_errors() -> dict[str, str | None]:
    """``{rule: None, or the error its script's imports raise}``: per conda env, one Python process imports, through
    each of its rules' workflow scripts and the package modules they import at their top, with every package the
    env lacks blocked (one process per env, not per rule: the modules a script shares with another are imported
    under the same env's blocks either way)."""
    errors = {}
    for env in sorted({env for _, env, _ in RULE_SCRIPTS}):
        forbidden = sorted(OPTIONAL_IMPORTS - ENV_IMPORTS[env])
        scripts = {rule: "\n".join(ast.unparse(node) for node in ast.parse((REPO / script).read_text()).body
                                   if isinstance(node, (ast.Import, ast.ImportFrom)))
                   for rule, rule_env, script in RULE_SCRIPTS if rule_env == env}
        probe = textwrap.dedent(f"""
            import json, sys
            class Block:
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in {forbidden!r}:
                        raise ImportError(f"{{name}} is not in envs/{env}.yaml")
            sys.meta_path.insert(0, Block())
            sys.path.insert(0, {str(REPO / "workflow_scripts")!r})
            errors = {{}}
            for rule, imports in {scripts!r}.items():
                try:
                    exec(imports, {{}})
                    errors[rule] = None
                except Exception as error:
                    errors[rule] = f"{{type(error).__name__}}: {{error}}"
            print(json.dumps(errors))
        """)
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, f"envs/{env}.yaml's probe failed: {result.stderr[-2000:]}"
        errors.update(json.loads(result.stdout.strip().splitlines()[-1]))
    return errors


@pytest.mark.parametrize("rule, env, script", RULE_SCRIPTS, ids=lambda value: str(value))
def test_a_jobs_imports_are_in_its_conda_env(rule, env, script, import_errors):
    """A job imports, through its workflow script and the package modules it imports at their top, only what its
    conda env installs (a torch import reached from an eval job fails there, not in the project venv)."""
    assert import_errors[rule] is None, f"rule {rule} ({script}, envs/{env}.yaml): {import_errors[rule]}"
