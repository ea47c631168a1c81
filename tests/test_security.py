"""Security basics, checked on the source so a regression fails CI: no unpickling of files (torch.load only with
weights_only=True, no pickle, no np.load with allow_pickle=True, no yaml.load), no shell strings (no shell=True,
os.system, os.popen), and model weights saved as safetensors. See docs/reliability.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO

# everything the pipeline runs: the package, the workflow scripts and rules, scripts, benchmarks and tests
PYTHON_SOURCES = sorted(p for folder in ("src", "workflow_scripts", "scripts", "benchmarks", "tests")
                        for p in (REPO / folder).rglob("*.py"))
SNAKEMAKE_SOURCES = sorted([REPO / "Snakefile", *(REPO / "rules").glob("*.smk")])


def keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def call_name(call: ast.Call) -> str:
    """``torch.load`` for ``torch.load(...)``, ``load`` for ``load(...)``."""
    parts, node = [], call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


UNPICKLERS = ("pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve")


def only_error_classes(tree: ast.AST, alias: str | None, name: str | None) -> bool:
    """An unpickling module imported only for its exception classes (``except pickle.UnpicklingError``): ``import
    pickle`` whose every use is ``pickle.<...>Error``, or ``from pickle import <...>Error``."""
    if name is not None:
        return name.endswith("Error")
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == alias]
    attributes = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id == alias]
    return bool(uses) and len(uses) == len(attributes) and all(a.attr.endswith("Error") for a in attributes)


def unsafe_calls(source: str) -> list[str]:
    """The unsafe patterns in one Python source, as ``line: what``."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.Import):
                imported = [(a.name, a.asname or a.name, None) for a in node.names]
            else:
                imported = [(node.module or "", None, a.name) for a in node.names]
            for module, alias, name in imported:
                if module.split(".")[0] in UNPICKLERS and not only_error_classes(tree, alias, name):
                    found.append(f"{node.lineno}: imports {module} (unpickling runs code)")
        if not isinstance(node, ast.Call):
            continue
        name = call_name(node)
        if name.endswith("torch.load") or name == "load" and keyword(node, "weights_only") is not None:
            if not is_true(keyword(node, "weights_only")):
                found.append(f"{node.lineno}: {name} without weights_only=True")
        if name.endswith("np.load") or name.endswith("numpy.load"):
            if keyword(node, "allow_pickle") is not None and not isinstance(keyword(node, "allow_pickle"),
                                                                           ast.Constant) \
                    or is_true(keyword(node, "allow_pickle")):
                found.append(f"{node.lineno}: {name} with allow_pickle")
        if name.endswith("yaml.load") or name.endswith("yaml.unsafe_load") or name.endswith("yaml.full_load"):
            found.append(f"{node.lineno}: {name} (use yaml.safe_load)")
        if keyword(node, "shell") is not None and not (isinstance(keyword(node, "shell"), ast.Constant)
                                                       and keyword(node, "shell").value is False):
            found.append(f"{node.lineno}: {name} with shell=...")
        if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
            found.append(f"{node.lineno}: {name} runs a shell string")
        if name.endswith("save_pretrained") and is_true(keyword(node, "safe_serialization")) is False \
                and keyword(node, "safe_serialization") is not None:
            found.append(f"{node.lineno}: {name} with safe_serialization other than True")
    return found


def test_the_scanner_finds_each_unsafe_pattern():
    unsafe = """
import pickle
from joblib import load
torch.load(path)
torch.load(path, weights_only=False)
np.load(path, allow_pickle=True)
yaml.load(text, Loader=yaml.Loader)
subprocess.run(f"java {options}", shell=True)
os.system("rm " + path)
model.save_pretrained(path, safe_serialization=False)
"""
    assert len(unsafe_calls(unsafe)) == 9
    assert len(unsafe_calls("import pickle\ntry:\n    pickle.loads(data)\nexcept pickle.UnpicklingError:\n    pass\n")) == 1
    assert len(unsafe_calls("from pickle import loads, UnpicklingError\n")) == 1
    safe = """
import pickle
try:
    load_model(path)
except pickle.UnpicklingError:
    raise
from pickle import UnpicklingError
torch.load(path, map_location="cpu", weights_only=True)
np.load(path, allow_pickle=False)
yaml.safe_load(text)
subprocess.run(["java", "-cp", jar], check=True)
model.save_pretrained(path, safe_serialization=True)
"""
    assert unsafe_calls(safe) == []


@pytest.mark.parametrize("path", PYTHON_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_unpickling_and_no_shell_strings_in_python_sources(path):
    if path == Path(__file__):
        return                                               # this file spells the patterns out on purpose
    assert unsafe_calls(path.read_text(encoding="utf-8")) == []


def test_no_shell_commands_built_from_config_in_the_rules():
    """Rules run Python scripts (``script:``), never ``shell:``/``run:`` strings with config values spliced in."""
    for path in SNAKEMAKE_SOURCES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s+(shell|run):", text, re.M), f"{path}: a shell/run directive"
        assert "os.system" not in text and "shell(" not in text, path


def test_subprocesses_get_argument_lists():
    """Pyserini (bm25.py) and torchrun (launch.py) are started with argument lists, no shell in between."""
    for module in ("src/dpr_pipeline/retrieval/bm25.py", "src/dpr_pipeline/training/launch.py"):
        tree = ast.parse((REPO / module).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n).startswith("subprocess.")]
        assert calls, module
        for call in calls:
            command = call.args[0]
            assert isinstance(command, (ast.List, ast.Name)), f"{module}:{call.lineno}: command is not a list"
            assert keyword(call, "shell") is None, f"{module}:{call.lineno}"


def unquoted_expansions(script: str) -> list[str]:
    """``line: text`` of each ``$VAR``/``${VAR}`` outside double quotes in a bash script, except in an assignment
    (``NAME=$x`` does not split words) and in here-documents (file contents, not commands)."""
    found, terminator = [], None
    for number, line in enumerate(script.splitlines(), 1):
        if terminator is not None:
            terminator = None if line.strip() == terminator else terminator
            continue
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        code = "" if line.lstrip().startswith("#") else line
        for match in re.finditer(r"\$\{?[A-Za-z_][A-Za-z_0-9]*", code):
            before = code[:match.start()]
            if before.count('"') % 2 == 0 and before.count("'") % 2 == 0 \
                    and not re.search(r"(^|\s)[A-Za-z_][A-Za-z_0-9]*=$", before):
                found.append(f"{number}: {line.strip()}")
        if heredoc:
            terminator = heredoc.group(1)
    return found


def test_the_quoting_check_finds_an_unquoted_variable():
    assert unquoted_expansions('rm -rf $DIR/tmp\nX=$Y\ncat <<EOF\n$Z\nEOF\necho "$Z"') == ["1: rm -rf $DIR/tmp"]


@pytest.mark.parametrize("name", ["start", "stop"])
def test_the_slurm_helper_scripts_quote_their_variables(name):
    """scripts/slurm/* (bash, run as root): every variable expansion in a command is double-quoted."""
    assert unquoted_expansions((REPO / "scripts" / "slurm" / name).read_text()) == []
