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

    Exit codes:
      0  report written
      2  usage error (a bad flag)
      4  bad run directory: missing, a file, unfinished, malformed, or
         read-only (checked before the report is drawn)
      70 internal error (a bug: NONDET_DEBUG=1 shows the traceback)
      130 interrupted (Ctrl-C)

    Example:  nondet report runs/feynman
    """
    from nondet.reports import write_report

    md_path, html_path = write_report(run_dir)
    typer.echo(str(md_path))
    typer.echo(str(html_path))
