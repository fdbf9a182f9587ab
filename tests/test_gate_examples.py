"""The examples: the GitHub workflow's own gate command, run in a model repository built from them."""

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def workflow_gate_command() -> str:
    workflow = yaml.safe_load((EXAMPLES / "github-workflow.yml").read_text())
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    commands = [s["run"].strip() for s in steps if s.get("run", "").strip().startswith("nondet gate")]
    assert len(commands) == 1, commands
    return commands[0]


@pytest.fixture
def model_repo(tmp_path, default_model_dir):
    """A model repository as the workflow checks it out: weights at the root, the snippet as pyproject."""
    shutil.copytree(default_model_dir, tmp_path, dirs_exist_ok=True)
    shutil.copy(EXAMPLES / "pyproject-snippet.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".git").mkdir()
    return tmp_path


def run_in_ci(command: str, repo: Path):
    """The step as GitHub Actions runs it: bash, the repository as cwd, GITHUB_* set."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(repo / "step-summary.md")}
    return subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=900)


def junit_failures(repo: Path) -> list[str]:
    root = ET.parse(repo / "nondet-junit.xml").getroot()
    return [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None]


@pytest.mark.slow
def test_workflow_gate_command_passes_with_the_promised_kernels(model_repo):
    r = run_in_ci(workflow_gate_command(), model_repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert junit_failures(model_repo) == []
    assert "## nondet gate: ✅ policy met (identical)" in (model_repo / "step-summary.md").read_text()
    assert (model_repo / "nondet-run" / "summary.json").is_file()


@pytest.mark.slow
def test_workflow_gate_command_fails_without_them(model_repo):
    # The same gate on default kernels must fail: the CI gate is not vacuous. The model gets one
    # norm made batch-variant on purpose, so this holds on every host, whatever its BLAS does.
    r = run_in_ci(workflow_gate_command() + " --kernels default --no-bisect --inject-variance", model_repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert junit_failures(model_repo) == ["default/bs8/ends"]
    assert "::error title=nondet gate%3A default/bs8/ends::identical: " in r.stdout
    assert "❌ policy violated" in (model_repo / "step-summary.md").read_text()


def test_pyproject_snippet_is_a_valid_gate_config(tmp_path):
    from nondet.gate.config import load_config, resolve
    from nondet.gate.policy import Policy

    shutil.copy(EXAMPLES / "pyproject-snippet.toml", tmp_path / "pyproject.toml")
    s = resolve({}, load_config(tmp_path / "pyproject.toml"), tmp_path / "pyproject.toml")
    assert (s.model, s.kernels, s.policy, s.batch_sizes) == (str(tmp_path), "batch-invariant", Policy(), (1, 8))
