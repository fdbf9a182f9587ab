"""--model/-m names the model on every command; gate's and rl's old positional MODEL still runs,
hidden from --help, with one warning line; both with different values is a usage error (exit 2)."""

import json
import os
import re
from pathlib import Path

import pytest

from nondet.cli.deprecated_model import WARNING, model_of
from nondet.errors import UsageError
import cli_runner

CONFLICT = ("nondet: error: the model is given twice: 'a' as a positional argument and 'b' as --model; "
            "give --model DIR only\n")
GATE_QUICK = ["-b", "1,2", "-n", "3", "--kernels", "batch-invariant", "--no-bisect", "--out", "run"]


def nondet(*args, cwd: Path | None = None):
    if cwd is not None:
        (cwd / ".git").mkdir(exist_ok=True)  # a repository root: no config file above it is read
    return cli_runner.run(args, cwd=cwd, env={**os.environ, "GITHUB_ACTIONS": "", "COLUMNS": "200"}, timeout=600)


def run_model(run_dir: Path) -> str:
    return json.loads((run_dir / "config.json").read_text())["config"]["model"]["name"]


def test_gate_takes_the_model_as_an_option(tmp_path, tiny_model_dir):
    r = nondet("gate", "--model", str(tiny_model_dir), *GATE_QUICK, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stderr == ""  # no deprecation warning
    assert run_model(tmp_path / "run") == str(tiny_model_dir)


def test_gate_positional_model_still_runs_with_one_warning(tmp_path, tiny_model_dir):
    r = nondet("gate", str(tiny_model_dir), "-m", str(tiny_model_dir), *GATE_QUICK, cwd=tmp_path)  # same value: ok
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stderr == WARNING + "\n"
    assert run_model(tmp_path / "run") == str(tiny_model_dir)


def test_rl_positional_model_warns_then_runs_on(tmp_path):
    # the warning, then the run's own (cheap) usage error: the positional value was accepted
    r = nondet("rl", "some-model", "--temperature", "0", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == WARNING and len(r.stderr.splitlines()) == 2


@pytest.mark.parametrize("command", ["gate", "rl"])
@pytest.mark.parametrize("flag", ["--model", "-m"])
def test_positional_and_option_that_differ_are_one_usage_error(tmp_path, command, flag):
    r = nondet(command, "a", flag, "b", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == CONFLICT
    assert r.stdout == ""


@pytest.mark.parametrize("command", ["probe", "bisect", "gate", "rl"])
def test_help_documents_model_as_an_option_only(command):
    out = nondet(command, "--help").stdout
    assert re.search(rf"Usage: .* {command} \[OPTIONS\]( \[RUN_DIR\])?\s*$", out, re.M), out[:400]
    assert re.search(r"--model\s+-m\s", out)
    assert "model_arg" not in out and "MODEL_ARG" not in out


def test_model_of():
    assert model_of(None, "b") == "b" and model_of(None, None) is None
    with pytest.raises(UsageError, match="^the model is given twice: 'a' as a positional argument and 'b' as "
                                         "--model; give --model DIR only$"):
        model_of("a", "b")
