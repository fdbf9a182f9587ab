"""`nondet report` as a user runs it (a subprocess), and the no-torch rule for reports."""

import os
import subprocess
import sys

from report_fixtures import write_run
import cli_runner


def _nondet(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NONDET_DEBUG"}
    return cli_runner.run(args, env=env, timeout=120)


def test_report_writes_and_prints_both_paths(tmp_path):
    run = write_run(tmp_path / "run", bisect=True)
    r = _nondet("report", str(run))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(run / "report.md"), str(run / "report.html")]
    assert (run / "report.html").stat().st_size > 10_000


def test_missing_run_dir_is_exit_4_and_one_line(tmp_path):
    r = _nondet("report", str(tmp_path / "nope"))
    assert r.returncode == 4
    assert r.stderr == f"nondet: error: run directory not found: {tmp_path / 'nope'} (create one with `nondet probe`)\n"
    assert r.stdout == ""


def test_incomplete_run_dir_is_exit_4(tmp_path):
    r = _nondet("report", str(tmp_path))
    assert r.returncode == 4
    assert r.stderr == (f"nondet: error: {tmp_path / 'conditions.jsonl'}: missing; not a finished probe run "
                        "(run `nondet probe` first)\n")


def test_report_help_has_an_example():
    r = _nondet("report", "--help")
    assert r.returncode == 0
    assert "Example:  nondet report runs/feynman" in r.stdout


def test_reports_import_no_torch(tmp_path):
    run = write_run(tmp_path / "run", bisect=True, confirm=True)
    code = ("import sys; import nondet.reports, nondet.rundir; nondet.reports.write_report(sys.argv[1]); "
            "import nondet.cli.report; "
            "bad = sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules); "
            "print(','.join(bad) or 'clean')")
    r = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "clean"
