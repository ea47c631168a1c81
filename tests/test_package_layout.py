"""The package's layout (docs/architecture.md, "Which module owns what"): every subpackage and module named in its
table, no import circle, and every import of the package itself at a module's top."""

import ast
import re

from conftest import REPO

PACKAGE = REPO / "src" / "dpr_pipeline"


def module_name(path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def package_imports(path) -> tuple[set[str], list[str]]:
    """The package's modules ``path`` imports at its top, and its imports of the package anywhere else."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
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
            late.append(f"{module_name(path)}:{node.lineno}: {ast.unparse(node)}")
    return top, late


def test_the_package_imports_itself_only_at_the_top_of_its_modules():
    late = [line for path in MODULES.values() for line in package_imports(path)[1]]
    assert not late, "imports of dpr_pipeline inside a function (move them to the top):\n" + "\n".join(late)


def test_no_import_circle():
    graph = {name: package_imports(path)[0] - {name} for name, path in MODULES.items()}
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


def test_the_architecture_page_names_every_subpackage_and_module():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Which module owns what"):text.index("## Where to add things")]
    rows = {match[0]: match[1] for match in re.findall(r"^\| `(\w+)/` \| (.*) \|$", section, re.M)}
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert set(rows) == subpackages
    for name in MODULES:
        parts = name.split(".")
        if len(parts) == 3 and parts[2] != "__init__":
            assert f"`{parts[2]}`" in rows[parts[1]], \
                f"docs/architecture.md: the {parts[1]}/ row does not name {parts[2]}"
        elif len(parts) == 2 and parts[1] not in subpackages:
            assert f"`{parts[1]}`" in section, f"docs/architecture.md does not name the module {parts[1]}"
