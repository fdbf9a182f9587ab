"""The dependency order kernels <- probes <- rl <- gate/reports <- cli, read from the import statements.

Every import counts, also those inside functions and under TYPE_CHECKING: a lazy import is
still a dependency.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nondet"

# package -> modules it must never import (prefix match on the dotted name). reports reads gate.json
# as a dict; gate gets its report writer from the caller.
FORBIDDEN = {
    "kernels": ("nondet.probes", "nondet.reports", "nondet.gate", "nondet.cli", "nondet.rundir"),
    "probes": ("nondet.gate", "nondet.reports", "nondet.cli"),
    "reports": ("nondet.probes", "nondet.gate", "nondet.cli", "torch", "transformers"),
    "gate": ("nondet.cli", "nondet.reports"),
    "rl": ("nondet.cli", "nondet.reports", "nondet.gate"),  # the gate runs rl; reports read its run directory
    "rundir": ("nondet.probes", "nondet.reports", "nondet.gate", "nondet.cli", "nondet.kernels", "torch",
               "transformers", "pandas"),
}


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every module imported by one file, relative imports resolved."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ("nondet", "reports", "fmt")
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, parts, path.name == "__init__.py")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from nondet import probes`
    return names


def _resolve(node: ast.ImportFrom, parts: tuple[str, ...], is_init: bool) -> str:
    if not node.level:
        return node.module or ""
    package = parts if is_init else parts[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _violations(package: str) -> list[str]:
    found = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for name in sorted(imported_modules(path)):
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[package]):
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    assert (PACKAGE / package).is_dir()
    assert _violations(package) == []


def test_the_scan_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    module = PACKAGE / "reports" / "x.py"  # never written: parsed from text below
    source = ("def f():\n    from nondet.probes.probe import run_probe\n"
              "from . import fmt\nfrom ..gate import policy\nimport torch.nn\n")
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source)
    assert {"nondet.probes.probe", "nondet.probes.probe.run_probe", "nondet.reports.fmt",
            "nondet.gate.policy", "torch.nn"} <= imported_modules(module)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _nondet_imports(path: Path) -> set[str]:
    """nondet modules this file imports, lazily or not; `from pkg import name` counts as pkg.name
    where that is a module; its own ancestor packages do not count (already being imported)."""
    me = _module_name(path)
    return {n for n in imported_modules(path) if n.startswith("nondet") and not me.startswith(n + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_outside_the_cli():
    # Lazy imports count: a cycle through a function-level import is still two modules that
    # cannot be understood apart. The cli registers its commands on the app by importing them:
    # that cycle is by design.
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts}
    graph = {m: {n for n in _nondet_imports(p) if n in modules and n != m} for m, p in modules.items()}
    assert _cycles(graph) == []
