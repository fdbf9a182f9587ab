"""`nondet gate` end to end on the embedded default: every exit code from a real case."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import cli_runner
from controls import FIX_KERNELS, SKIP_PREFIX

from nondet.gate.github import md

# A positive control on every host: one norm of the demo model made batch-variant on purpose, so
# the bits of batch size 8 differ from the first decode step whatever the host's BLAS does
# (its own kernels may add differences from step 0, and tokens may flip, depending on the host).
QUICK = ["--batch-sizes", "1,8", "--max-new-tokens", "40", "--inject-variance"]


def gate(*args, cwd: Path, env=None):
    (cwd / ".git").mkdir(exist_ok=True)  # a repository root: no config file above it is read
    full_env = {**os.environ, "GITHUB_ACTIONS": "", **(env or {})}
    return cli_runner.run(["gate", *args], cwd=cwd, env=full_env, timeout=600)


@pytest.fixture(scope="module")
def violated(tmp_path_factory, default_model_dir):
    """One gate run without the mode, under GitHub Actions, with JUnit: shared by several tests."""
    work = tmp_path_factory.mktemp("gate-violated")
    summary = work / "step-summary.md"
    r = gate(*QUICK, "--junit", "junit.xml", "--out", "run", cwd=work,
             env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    return r, work, summary


def test_violated_policy_exits_1(violated):
    r, work, _ = violated
    assert r.returncode == 1, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert any(line.startswith("nondet gate: policy violated (identical): 1 of 1 condition(s) fail; "
                               "default/bs8/ends: ") for line in lines)
    assert "junit: junit.xml" in lines
    assert (work / "run" / "summary.json").is_file() and (work / "run" / "streams.jsonl").is_file()
    verdict = json.loads((work / "run" / "gate.json").read_text())
    assert verdict["passed"] is False and verdict["policy"]["require"] == "identical"
    assert [c["condition_id"] for c in verdict["conditions"] if not c["passed"]] == ["default/bs8/ends"]
    report = (work / "run" / "report.md").read_text()
    assert "CI gate (identical): policy violated by 1 of 1 condition(s)." in report
    # the gate's own command line to reproduce it (not "nondet probe gate ..."), and the mode as a second gate run
    assert "\nnondet gate --batch-sizes 1,8 --max-new-tokens 40 --inject-variance" in report
    assert "nondet probe gate" not in report and "--inject-variance --junit junit.xml --out run --kernels batch-invariant`" in report


def test_violation_is_bisected_where_the_bits_are_born(violated):
    r, work, _ = violated
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("bisect: first differing activation bits at step ")
    verdict = json.loads((work / "run" / "gate.json").read_text())
    failing = next(c for c in verdict["conditions"] if not c["passed"])
    step = int(last.split(" at step ")[1].split()[0])
    assert step <= failing["first_numeric_divergence"]  # born no later than the logprob shows it
    assert " in model.layers." in last
    assert last.endswith("(bisect.json in run)")
    assert (work / "run" / "bisect.json").is_file()


def test_junit_parses_and_names_the_failing_condition(violated):
    _, work, _ = violated
    root = ET.parse(work / "junit.xml").getroot()
    case = root.find("testsuite/testcase")
    assert (case.get("classname"), case.get("name")) == ("nondet.gate.default", "default/bs8/ends")
    message = case.find("failure").get("message")
    assert message.startswith(("first token divergence at step ", "same tokens, but logprob bits differ"))


def test_github_annotations_and_step_summary(violated):
    r, _, summary = violated
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1 and errors[0].startswith("::error title=nondet gate%3A default/bs8/ends::identical: ")
    text = summary.read_text()
    assert text.startswith("## nondet gate: ❌ policy violated (identical)")
    assert "| default/bs8/ends | 2 |" in text
    printed = next(line for line in r.stdout.splitlines() if line.startswith("bisect: "))
    assert printed.startswith("bisect: first differing activation bits at step ")
    line = printed.rsplit(" (bisect.json in ", 1)[0]  # the terminal adds where bisect.json is
    assert f"\n{md(line)}\n" in text  # the summary holds what the gate printed, Markdown-escaped
    assert "the sampled token's logprob bits differ" in text  # and says which number is which


def test_met_policy_with_batch_invariant_kernels_exits_0(tmp_path, default_model_dir):
    case = ("--batch-sizes", "1,8", "--max-new-tokens", "24", "--no-bisect")
    control = gate(*case, "--kernels", "default", "--out", "control", cwd=tmp_path)  # this host's own kernels
    if control.returncode == 0:
        pytest.skip(f"{SKIP_PREFIX}the default kernels are invariant on the embedded model at bs 8, 24 tokens")
    assert control.returncode == 1, control.stdout + control.stderr
    r = gate(*case, "--kernels", FIX_KERNELS, "--junit", "junit.xml", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-2] == \
        "nondet gate: policy met (identical): 1 condition(s) agree with the reference"
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.get("failures") == "0" and root.find(".//testcase").get("name") == f"{FIX_KERNELS}/bs8/ends"


def test_missing_model_exits_3(tmp_path):
    missing = tmp_path / "no-such-model"
    r = gate("--model", str(missing), cwd=tmp_path)
    assert r.returncode == 3
    assert r.stderr == f"nondet: error: model directory not found: {missing}\n"


def test_unreachable_server_exits_3(tmp_path):
    (tmp_path / "nondet.toml").write_text('endpoint = "http://127.0.0.1:9"\nmax-new-tokens = 4\n')
    r = gate("--junit", "junit.xml", cwd=tmp_path)
    assert r.returncode == 3
    assert r.stderr.startswith("nondet: error: cannot reach http://127.0.0.1:9/v1/models: connection refused")
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "junit.xml").exists()


def test_unknown_kernels_mode_exits_2(tmp_path):
    r = gate("--kernels", "fast", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "nondet: error: --kernels must be one of default, batch-invariant, not 'fast'\n"


def test_help_documents_the_exit_codes_and_imports_no_torch():
    code = ("import sys; sys.argv=['nondet', 'gate', '--help']\n"
            "from nondet.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('torch', 'transformers', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "100"})
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    for line in ("0  policy met", "1  policy violated (never 0 on a violation)",
                 "2  usage or configuration error", "3  could not run: model missing or not loadable"):
        assert line in out.stdout


def test_several_prompts_share_batches_in_one_run_directory(tmp_path, tiny_model_dir):
    # the default (positions auto): every row a target, so one probe whose batches hold both prompts
    r = gate("--model", str(tiny_model_dir), "-p", "first prompt", "-p", "second <prompt>", "-b", "1,2", "-n", "4",
             "--kernels", "batch-invariant", "--junit", "junit.xml", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["modes"]["batch-invariant"]["n_prompts"] == 2
    assert any("/rows/" in c["condition_id"] for c in summary["modes"]["batch-invariant"]["conditions"])
    assert not (tmp_path / "run" / "prompt-1").exists()
    assert len(ET.parse(tmp_path / "junit.xml").getroot().findall("testsuite")) == 1


@pytest.mark.parametrize("kernels, code", [("default", 1), ("batch-invariant", 0)])
def test_several_prompts_in_rows_gate_the_injected_variance(tmp_path, default_model_dir, kernels, code):
    # positive control (the injected norm: every machine) and negative control (the mode fixes it),
    # with the prompts sharing batches: each is judged against itself alone
    r = gate("-p", "Tell me about Richard Feynman", "-p", "Explain the Krebs cycle in two sentences.",
             "-b", "1,2", "-n", "12", "--inject-variance", "--kernels", kernels, "--no-bisect", "--out", "run",
             cwd=tmp_path)
    assert r.returncode == code, r.stdout + r.stderr
    if code:
        assert "fail; default/bs2/rows/0: prompt 0 ('Tell me about Richard Feynman'): " in r.stdout, r.stdout


def test_several_prompts_get_a_run_directory_and_a_testsuite_each(tmp_path, tiny_model_dir):
    # under the mode the tiny model passes: this checks the plumbing, not the model.
    r = gate("--model", str(tiny_model_dir), "-p", "first prompt", "-p", "second <prompt>", "-b", "1,3", "-n", "4",
             "--positions", "ends", "--kernels", "batch-invariant", "--junit", "junit.xml", "--out", "run",
             cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "run" / "prompt-1" / "summary.json").is_file()
    assert (tmp_path / "run" / "prompt-2" / "summary.json").is_file()
    suites = ET.parse(tmp_path / "junit.xml").getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == ["nondet gate: prompt 'first prompt'",
                                               "nondet gate: prompt 'second <prompt>'"]
