"""The package's layout (docs/architecture.md, "Which module owns what"): no import circle (late imports included),
the layers read top to bottom (an import back up only where BACK_ARROWS below lists it with its reason, at most 5),
and every import of the package itself at a module's top but where a module that Snakemake reads when it plans
defers one that loads a heavy dependency (``# heavy: <package>``)."""

import ast
import re
import subprocess
import sys

from conftest import REPO

PACKAGE = REPO / "src" / "dpr_pipeline"


def module_name(path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


HEAVY = re.compile(r"#\s*heavy: (\w+)")


def package_imports(path) -> tuple[set[str], list[str]]:
    """The package's modules ``path`` imports at its top, and its imports of the package anywhere else (each
    ``module:line: import``, the reason marked on its line after a ``|``)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    top, late = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        targets = {name for name in names if name in MODULES}
        if not targets:
            continue
        if node in tree.body:
            top |= targets
        else:
            heavy = HEAVY.search(lines[node.lineno - 1])
            late.append(f"{module_name(path)}:{node.lineno}: {ast.unparse(node)}"
                        + (f" | {heavy.group(1)} {' '.join(sorted(targets))}" if heavy else ""))
    return top, late


def imports_at_top(module: str, package: str) -> bool:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Import) and any(a.name.split(".")[0] == package for a in node.names)
               or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package
               for node in tree.body)


def test_the_package_imports_itself_only_at_the_top_of_its_modules():
    """A late import of the package is marked with the heavy dependency it defers, which the imported module
    really imports at its top."""
    late = [line for path in MODULES.values() for line in package_imports(path)[1]]
    unmarked = [line for line in late if " | " not in line]
    assert not unmarked, "imports of dpr_pipeline inside a function (move them to the top):\n" + "\n".join(unmarked)
    for line in late:
        heavy, *targets = line.split(" | ")[1].split()
        assert any(imports_at_top(target, heavy) for target in targets), f"{line}: imports no {heavy} at its top"


def test_snakemake_plans_without_torch():
    """What rules/*.smk import when Snakemake parses the workflow loads no torch (seconds on every run)."""
    imported = sorted({m for smk in (REPO / "rules").glob("*.smk")
                       for m in re.findall(r"^(?:from|import) (dpr_pipeline[\w.]*)", smk.read_text(), re.M)})
    code = ("import sys; " + "; ".join(f"import {m}" for m in imported)
            + "; print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the package's modules, the deferred ones included."""
    graph = {name: package_imports(path)[0] - {name} for name, path in MODULES.items()}
    for path in MODULES.values():
        for line in package_imports(path)[1]:
            graph[line.split(":")[0]] |= set(line.split(" | ")[1].split()[1:]) if " | " in line else set()
    return graph


def test_no_import_circle():
    graph = import_graph()
    # a package imports its own modules only when one of them imports the package: no edges from __init__ needed
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name):
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name)

#: Most imports that may run back up the layers (each listed in docs/architecture.md with its reason).
MAX_BACK_ARROWS = 5


#: The layers from the bottom (docs/architecture.md says the same in words): a module imports its layer and those
#: below.
LAYERS = ["top level", "data", "models", "retrieval", "evaluation", "training", "reranking", "pretraining", "report",
          "orchestration"]

#: The imports that run back up, each with its reason (docs/architecture.md lists them).
BACK_ARROWS = {
    ("evaluation.metrics", "orchestration.manifests"): "metrics.json hashes its files as a manifest does",
    ("evaluation.summary", "training.selection_record"): "the summary words each dev selection as its record does",
    ("evaluation.summary", "reranking.score_fusion"): "the summary words the fusion choice as its record does",
    ("training.launch", "orchestration.job_log"): "a torchrun worker quiets third-party logs as `logged` does",
}


def declared_layers() -> dict[str, int]:
    return {name: layer for layer, name in enumerate(LAYERS)}


def declared_back_arrows() -> dict[tuple[str, str], str]:
    return BACK_ARROWS


def layer_of(module: str, layers: dict[str, int]) -> int:
    parts = module.split(".")
    return layers[parts[1]] if len(parts) > 2 or (len(parts) == 2 and parts[1] in layers) else layers["top level"]


def back_arrows() -> set[tuple[str, str]]:
    """The imports from a module to one of a higher layer (package names without ``dpr_pipeline.``)."""
    layers = declared_layers()
    short = lambda name: name.removeprefix("dpr_pipeline.")  # noqa: E731
    return {(short(source), short(target)) for source, targets in import_graph().items() for target in targets
            if layer_of(target, layers) > layer_of(source, layers)}


def test_every_subpackage_sits_in_one_layer():
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert set(declared_layers()) == subpackages | {"top level"}


def test_the_layers_read_top_to_bottom():
    """An import runs down the layers, or up only where BACK_ARROWS lists it with its reason: a new one
    fails here (move the code, or list it and say why), and so does a listed one that is gone."""
    found, listed = back_arrows(), declared_back_arrows()
    assert all(listed.values())
    unlisted = sorted(found - set(listed))
    assert not unlisted, ("imports that run back up the layers (move the code down, or list it in BACK_ARROWS with "
                          "its reason and in docs/architecture.md):\n" + "\n".join(f"{a} -> {b}" for a, b in unlisted))
    assert sorted(set(listed) - found) == [], "BACK_ARROWS lists imports back up that are gone"
    assert len(found) <= MAX_BACK_ARROWS


def test_training_and_reranking_do_not_import_each_other():
    graph = import_graph()

    def imports(package, other):
        return any(target.startswith(f"dpr_pipeline.{other}") for name, targets in graph.items()
                   if name.startswith(f"dpr_pipeline.{package}") for target in targets)

    assert not (imports("training", "reranking") and imports("reranking", "training"))


def test_no_module_is_named_like_snakemakes_workflow_global():
    """rules/*.smk use Snakemake's ``workflow`` object; no module of the package shares its name."""
    assert not [name for name in MODULES if "workflow" in name.split(".")]
