"""--help reflows: a docstring's hard wraps do not survive into the terminal (they broke sentences
in the middle on a narrower terminal)."""

import os
import subprocess
import sys

import pytest

from nondet.cli.helptext import reflowable


def test_prose_paragraphs_become_one_line_and_examples_stay():
    doc = """Do a thing.

    The reference is the prompt alone. Every run
    is diffed against it.

    Example:  nondet probe -b 1,2
    Under load:  nondet probe --load continuous
    """
    assert reflowable(doc) == ("Do a thing.\n\nThe reference is the prompt alone. Every run is diffed against it."
                               "\n\nExample:  nondet probe -b 1,2\nUnder load:  nondet probe --load continuous")


@pytest.mark.parametrize("command", ["probe", "bisect", "gate", "rl", "report"])
def test_wide_terminal_shows_each_sentence_on_one_line(command):
    env = {**os.environ, "COLUMNS": "3000"}
    out = subprocess.run([sys.executable, "-m", "nondet", command, "--help"], capture_output=True, text=True,
                         env=env, timeout=120).stdout
    description = out.split("Usage:")[1].split("╭")[0]
    # prose lines: not examples or table rows (two spaces inside, as "0  policy met"), not indented
    prose = [ln.strip() for ln in description.splitlines()[1:] if ln.strip() and "  " not in ln.strip()
             and not ln.strip().startswith("nondet ")]
    # with room for everything, a prose line ends a sentence or a clause, never mid-phrase
    broken = [ln for ln in prose if not ln.endswith((".", ":", ")", ";", "]", "`"))]
    assert not broken, broken
