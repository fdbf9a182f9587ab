"""Every command's --help lists its exit codes (the root's showed none: typer prints the Typer's help, not the
callback's docstring), and the gate checks its --junit path before it runs (a directory there turned a finished
gate's verdict into exit 70)."""

import os

import pytest

import cli_runner


@pytest.mark.parametrize("command", [[], ["probe"], ["rl"], ["gate"], ["kernels", "bench"], ["kernels", "tune"],
                                     ["kernels", "coverage"]])
def test_help_lists_the_exit_codes(command):
    done = cli_runner.run([*command, "--help"], env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "Exit codes" in text and "70 internal error" in text and "130 interrupted" in text, text[-600:]


def test_a_junit_path_that_cannot_be_a_file_is_refused_before_the_gate_runs(tmp_path):
    done = cli_runner.run(["gate", "--no-bisect", "-n", "2", "-b", "1,2", "-p", "hi", "--junit", str(tmp_path),
                           "--out", str(tmp_path / "run")])
    assert done.returncode == 2 and done.stderr.strip() == (
        f"nondet: error: --junit {tmp_path} is a directory; pass a file path such as {tmp_path / 'junit.xml'}")
    assert not (tmp_path / "run").exists()  # nothing ran
    afile = tmp_path / "afile"
    afile.write_text("")
    done = cli_runner.run(["gate", "--junit", str(afile / "j.xml")])
    assert done.returncode == 2 and "which is not a directory" in done.stderr


def test_a_junit_file_that_cannot_be_written_after_the_run_is_a_warning(tmp_path, monkeypatch):
    from nondet.gate import run

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run, "write_junit", full_disk)
    result = run.GateResult([])
    run._write_junit(str(tmp_path / "j.xml"), result, run.GateHooks(), 1.0)
    assert result.warnings == [f"cannot write the JUnit file {tmp_path / 'j.xml'}: No space left on device; "
                               "the gate's verdict stands"]
