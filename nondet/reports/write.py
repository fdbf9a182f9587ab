"""write_report: run directory -> report.md, report.html and figures/*.svg inside it."""

from pathlib import Path

from nondet.errors import RunDirError
from nondet.reports.blocks import Figure
from nondet.reports.content import build_report
from nondet.reports.html import render_html
from nondet.reports.tables import read_tables
from nondet.reports.markdown import render_markdown
from nondet.reports.rl_sections import is_rl_run, rl_report
from nondet.rundir import RunDir, reader
from nondet.rundir.files import FIGURES
from nondet.rundir.writer import require_writable, write_figure, write_report_pages


def write_report(run_dir) -> tuple[Path, Path]:
    """Render the run directory's report; returns (report.md path, report.html path)."""
    rd = RunDir(run_dir)
    reader.require_finished(rd)  # an interrupted run's streams are no basis for a verdict
    require_writable(rd, "report")  # before the figures are drawn, not after
    try:
        report = rl_report(run_dir) if is_rl_run(run_dir) else build_report(read_tables(run_dir))
    except (KeyError, TypeError, ValueError) as exc:  # a summary.json or bisect.json field is off
        raise RunDirError(f"{run_dir}: malformed run directory ({type(exc).__name__}: {exc})") from exc
    try:
        return _write(rd, report)
    except OSError as exc:  # what the check could not see: a full disk, a read-only figures/ folder
        raise RunDirError(f"cannot write the report into {rd.path}: {exc.strerror or exc}") from exc


def _write(rd: RunDir, report) -> tuple[Path, Path]:
    for section in report.sections:
        for block in section.blocks:
            if isinstance(block, Figure):
                write_figure(rd, block.name, block.svg)
    return write_report_pages(rd, render_markdown(report, FIGURES), render_html(report))
