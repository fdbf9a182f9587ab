"""`nondet report RUN_DIR`: render report.md and report.html from a run directory."""

from pathlib import Path
from typing import Annotated

import typer

from nondet.cli.app import app


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `nondet probe` (and maybe bisect).")],
) -> None:
    """Write report.md and report.html (with figures/) into RUN_DIR, from its files alone.

    report.html is self-contained: open it in any browser or attach it to a bug. report.md
    suits a PR comment or a CI step summary. Needs no GPU and no torch. Prints both paths.

    Example:  nondet report runs/feynman
    """
    from nondet.reports import write_report

    md_path, html_path = write_report(run_dir)
    typer.echo(str(md_path))
    typer.echo(str(html_path))
