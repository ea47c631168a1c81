"""The package's layout (docs/architecture.md, "Which module owns what"): no import circle (late imports
included), and every import of the package itself at a module's top but where a module that Snakemake reads when it plans defers one that loads a heavy dependency (``# heavy: <package>``)."""

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


def test_no_import_circle():
    graph = {name: package_imports(path)[0] - {name} for name, path in MODULES.items()}
    for path in MODULES.values():  # the deferred ones count too
        for line in package_imports(path)[1]:
            graph[line.split(":")[0]] |= set(line.split(" | ")[1].split()[1:]) if " | " in line else set()
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

