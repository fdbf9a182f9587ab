"""The package's layout: only nondet/rundir names the run directory's files.

Every other stage reads and writes a run directory through nondet.rundir's reader and writer
(docs/architecture.md), so a file's name, shape and checks live in one place. The check reads
string constants from the syntax tree: a comment or a docstring that mentions a file for the
reader does not count, and neither does a message that names one inside a sentence.
"""

import ast
from pathlib import Path

from nondet.rundir.files import RUN_FILES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nondet"

# (module, string) pairs that spell a run directory's file name but mean something else
NOT_RUN_FILES = {
    ("nondet/probes/loading.py", "config.json"): "a model directory's Hugging Face config",
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
