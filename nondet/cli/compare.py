"""`nondet compare RUN_A RUN_B`: are two probe runs bit for bit the same?"""

import sys
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
      4  a run directory is missing or cannot be read

    Example:  nondet compare runs/h100 runs/h200
    """
    from nondet.rundir.compare import compare_runs

    result = compare_runs(str(run_a), str(run_b))
    for line in result.lines():
        typer.echo(line)
    sys.exit(0 if result.identical else 1)  # sys.exit, not typer.Exit: standalone_mode=False would swallow it
