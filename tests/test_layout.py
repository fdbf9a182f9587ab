"""The package's layout (docs/architecture.md).

Only nondet/rundir names the run directory's files: every other stage reads and writes a run
directory through its reader and writer, so a file's name, shape and checks live in one place.
The check reads string constants from the syntax tree: a comment or a docstring that mentions a
file for the reader does not count, and neither does a message that names one inside a sentence.

nondet/probes holds one package per axis beside the shared core, bisect and models; its root
keeps only the entries that choose an axis, and imports point from the root to the axes to
bisect, models and core, never back.
"""

import ast
from pathlib import Path

from nondet.rundir.files import RUN_FILES
from test_dependencies import imported_modules

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nondet"
PROBES = PACKAGE / "probes"
MAX_ROOT_MODULES = 12

# a subpackage of nondet/probes -> the subpackages it may import (besides itself); the root's
# modules may import any of them
MAY_IMPORT = {
    "core": set(),
    "models": {"core"},
    "bisect": {"core"},
    "static": {"core", "models", "bisect"},
    "continuous": {"core", "models"},
    "server": {"core", "models"},
    "speculative": {"core", "models", "bisect"},
    "rl": {"core", "models", "bisect", "continuous", "server"},  # its sampler runs in the engine or on a server
    "tp": {"core", "models", "bisect", "static"},  # the static axis's conditions, on N ranks
}

# (module, string) pairs that spell a run directory's file name but mean something else
NOT_RUN_FILES = {
    ("nondet/probes/models/loading.py", "config.json"): "a model directory's Hugging Face config",
    ("nondet/reports/content.py", "figures"): "the report's section anchor",
}


def _names_a_run_file(text: str) -> bool:
    return any(text == name or text.startswith(f"{name}/") for name in RUN_FILES)


def run_file_literals(path: Path, root: Path = ROOT) -> list[str]:
    """'file:line: name' for each string constant in `path` that is a run directory's file name."""
    module = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and _names_a_run_file(node.value) and (module, node.value) not in NOT_RUN_FILES]
    return [f"{module}:{node.lineno}: {node.value!r}" for node in sorted(hits, key=lambda n: n.lineno)]


def test_only_rundir_names_the_run_directory_files():
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != "rundir"]
    found = [hit for path in outside for hit in run_file_literals(path)]
    assert not found, ("read and write run-directory files through nondet.rundir (reader.py, writer.py, "
                       "files.py's names), not by name:\n" + "\n".join(found))


def test_the_check_sees_file_names_in_code_not_in_docstrings_or_comments(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Reads summary.json."""\n# streams.jsonl\nx = "streams.jsonl"\n'
                      'y = f"figures/{x}"\nz = "see summary.json"\n')
    assert run_file_literals(module, tmp_path) == ["m.py:3: 'streams.jsonl'", "m.py:4: 'figures/'"]


def test_the_probes_root_holds_at_most_12_modules():
    modules = sorted(p.name for p in PROBES.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, f"{len(modules)} modules at nondet/probes/: {modules}"


def test_every_probes_subpackage_has_its_place():
    packages = sorted(p.name for p in PROBES.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(MAY_IMPORT)


def _probes_part(module: str) -> str | None:
    """Which part of nondet.probes a dotted name lies in: a subpackage's name, "root" for a module
    at the probes root, None outside nondet.probes (or the bare package)."""
    parts = module.split(".")
    if parts[:2] != ["nondet", "probes"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in MAY_IMPORT else "root"


def test_probes_imports_point_from_the_root_to_the_axes_to_the_core():
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((PROBES / package).rglob("*.py")):
            for name in sorted(imported_modules(path)):
                part = _probes_part(name)
                if part not in (None, package, *allowed):
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}: {package}/ may import {sorted(allowed)}")
    assert wrong == []
