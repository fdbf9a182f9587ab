"""`nondet compare RUN_A RUN_B`: are two probe runs bit for bit the same?"""

import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Annotated

import typer

from nondet.cli.app import app


@app.command("compare")
def compare(
    run_a: Annotated[Path, typer.Argument(help="A run directory written by `nondet probe`.")],
    run_b: Annotated[Path, typer.Argument(help="Another run directory of the same probe command.")],
) -> None:
    """Compare two probe runs stream by stream, every token and logprob bit: one fleet, one answer.

    Run the same probe on two machines (an H100 and an H200, two CPUs, a tuned and an untuned
    kernel table) under the mode, bring one run directory to the other, and compare. Streams are
    paired by condition, row and prompt. Prints, first, the probe settings that decide which streams
    exist (prompts, batch sizes, tokens, seed, ...) where the two runs' configs differ, and the
    settings that can move bits (device, CPU instruction set, library versions, dtype, kernels,
    kernel table, decode path, the model's shape) where their fingerprints differ; then each stream
    that differs, with its first divergent token and first divergent logprob bits; last, "N of M
    streams bitwise equal". Needs no GPU and no torch.

    Exit codes:
      0  every stream bitwise equal
      1  some stream differs, or has no twin in the other run
      2  usage error: a bad flag, or both arguments name the same run
         directory (it would equal itself)
      4  bad run directory: missing, a file, unfinished, malformed, or with a
         record cut off (a comparison needs every record)
      70 internal error (a bug: NONDET_DEBUG=1 shows the traceback)
      130 interrupted (Ctrl-C: compare writes nothing)

    Example:  nondet compare runs/h100 runs/h200
    """
    from nondet.errors import UsageError
    from nondet.rundir.compare import compare_runs

    if run_a.is_dir() and run_a.resolve() == run_b.resolve():  # a file given twice: "is a file", exit 4
        raise UsageError(f"{run_a} and {run_b} are the same run directory: it would equal itself; compare "
                         "two runs of the probe (another machine's, or another day's)")
    result = compare_runs(str(run_a), str(run_b))
    width = _width()
    for line in result.lines():
        for part in fold(line, width):
            typer.echo(part)
    sys.exit(0 if result.identical else 1)  # sys.exit, not typer.Exit: standalone_mode=False would swallow it


def _width() -> int | None:
    """The terminal's width, or COLUMNS; None for a pipe or a file without COLUMNS (each line whole, for grep)."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def fold(line: str, width: int | None) -> list[str]:
    """A line wider than the terminal, broken where its items meet ('; ' between settings, else ', '
    between a stream's two divergences), the lines after the first indented; an item still too wide
    breaks between words."""
    if width is None or len(line) <= width:
        return [line]
    sep = "; " if "; " in line else ", "
    items = [item + sep for item in line.split(sep)]
    items[-1] = items[-1][:-len(sep)]
    lines = [""]  # the items packed into lines, indent left out
    for item in items:
        if lines[-1] and len(INDENT if len(lines) > 1 else "") + len(lines[-1] + item.rstrip()) > width:
            lines.append("")
        lines[-1] += item
    return [part for i, text in enumerate(lines) for part in
            textwrap.wrap(text.strip(), width, initial_indent=INDENT if i else "", subsequent_indent=INDENT,
                          break_long_words=False, break_on_hyphens=False)]


INDENT = "  "  # a folded line's continuation
