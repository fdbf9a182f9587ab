"""Reports: run directory -> tables (pandas), figures (SVG, svg.py), report.md and report.html.

Imports no torch: a report can be rendered on any machine from the run directory alone.
The names below load on first use, so importing `nondet.reports` stays light (no pandas).

    from nondet.reports import read_tables, write_report
    tables = read_tables("RUN_DIR")       # DataFrames: streams, runs, conditions, ...
    md_path, html_path = write_report("RUN_DIR")
"""

__all__ = ["RunTables", "read_tables", "write_report"]


def __getattr__(name: str):
    if name in ("RunTables", "read_tables"):
        from nondet.reports import tables

        return getattr(tables, name)
    if name == "write_report":
        from nondet.reports.write import write_report

        return write_report
    raise AttributeError(f"module 'nondet.reports' has no attribute {name!r}")
