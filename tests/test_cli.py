"""CLI: exit codes and exact one-line messages for bad input; --help imports no torch."""

import os
import subprocess
import sys

import pytest
import cli_runner


def nondet(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return cli_runner.run(args, env=full_env, timeout=300)


@pytest.mark.parametrize("args", [["--help"], ["probe", "--help"]])
def test_help_imports_no_torch(args):
    code = ("import sys; sys.argv=['nondet', *%r]\n"
            "from nondet.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'triton') if m in sys.modules]\n"
            "print('HEAVY', heavy)") % (args,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "Usage" in out.stdout


def test_missing_model_dir(tmp_path):
    missing = tmp_path / "no-such-model"
    r = nondet("probe", "--model", str(missing))
    assert r.returncode == 3
    assert r.stderr.strip() == f"nondet: error: model directory not found: {missing}"


def test_unloadable_model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    r = nondet("probe", "--model", str(tmp_path))
    assert r.returncode == 3
    assert r.stderr.strip().startswith(f"nondet: error: cannot load model '{tmp_path}'")
    assert len(r.stderr.strip().splitlines()) == 1


def test_batch_size_zero():
    r = nondet("probe", "--batch-sizes", "0,2")
    assert r.returncode == 2
    assert r.stderr.strip() == "nondet: error: --batch-sizes: every batch size must be an integer >= 1"


def test_empty_prompt():
    r = nondet("probe", "--prompt", "   ")
    assert r.returncode == 2
    assert r.stderr.strip() == "nondet: error: the prompt is empty; pass --prompt TEXT or --prompt-file FILE"


def test_unreadable_prompt_file(tmp_path):
    missing = tmp_path / "prompt.txt"
    r = nondet("probe", "--prompt-file", str(missing))
    assert r.returncode == 2
    assert r.stderr.strip() == f"nondet: error: cannot read prompt file {missing}: No such file or directory"


def test_debug_shows_traceback(tmp_path):
    r = nondet("probe", "--batch-sizes", "0", env={"NONDET_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_probe_json_summary(tmp_path):
    r = nondet("probe", "--batch-sizes", "1,2", "--max-new-tokens", "6", "--json", "--out", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    import json

    data = json.loads(r.stdout)
    # No --prompt: the 8 built-in prompts, each alone, then every row a target at batch size 2
    # (prompts of equal token length share a batch): 8 references + 8 batched rows (it
    # would be 8 + 2 copies x 8 = 24 if each prompt had its own batches).
    m = data["modes"]["default"]
    assert (m["n_prompts"], m["n_runs"]) == (8, 16) and data["run_dir"] == str(tmp_path / "r")
    assert sum(r["condition_id"].startswith("default/bs2/rows/") for r in m["runs"]) == 8
    assert [p["prompt"] for p in m["prompts"]][:1] == ["Tell me about Richard Feynman"]
