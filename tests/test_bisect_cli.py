"""`nondet bisect`: exit codes and exact one-line messages; --help imports no torch."""

import json
import os
import subprocess
import sys
import cli_runner


def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=300)


def test_missing_run_dir(tmp_path):
    missing = tmp_path / "no-such-run"
    r = nondet("bisect", str(missing))
    assert r.returncode == 4
    assert r.stderr.strip() == f"nondet: error: run directory not found: {missing} (create one with `nondet probe`)"


def _probe_dir(tmp_path, divergent: bool):
    """A minimal probe run directory (no model run needed for these errors)."""
    from nondet.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    rd.write_json("config.json", {"command": "probe", "config": {}})
    rd.append_jsonl("conditions.jsonl", {"condition_id": "default/bs1/ref", "kernels": "default", "batch_size": 1,
                                         "positions": [0], "fillers": "none"})
    rd.append_jsonl("conditions.jsonl", {"condition_id": "default/bs4/last", "kernels": "default", "batch_size": 4,
                                         "positions": [3], "fillers": "same-length"})
    step = 3 if divergent else None
    runs = [{"run_id": 0, "condition_id": "default/bs1/ref", "position": 0, "first_token_divergence": None,
             "first_numeric_divergence": None},
            {"run_id": 1, "condition_id": "default/bs4/last", "position": 3, "first_token_divergence": None,
             "first_numeric_divergence": step}]
    rd.write_json("summary.json", {"modes": {"default": {"reference_run_id": 0, "runs": runs}}})
    rd.append_jsonl("streams.jsonl", {"run_id": 0, "steps": []})
    return rd.path


def test_no_divergent_condition_is_a_verdict_not_an_error(tmp_path):
    """An invariant probe run is a good run: one line on stdout, exit 0, nothing written; --json says the same.
    Its control: the same directory with one divergent run goes past the choice (and stops at a later check
    of a field this minimal summary lacks), so the early exit is the verdict's, not every directory's."""
    path = _probe_dir(tmp_path, divergent=False)
    r = nondet("bisect", str(path))
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.strip() == (f"nothing to bisect: {path}: no condition diverged from its reference "
                                "(every run is bit-identical)")
    assert not (path / "bisect.json").exists()
    r = nondet("bisect", str(path), "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout) == {"bisected": False, "reason": f"{path}: no condition diverged from its "
                                                                 "reference (every run is bit-identical)"}
    control = _probe_dir(tmp_path / "divergent", divergent=True)
    r = nondet("bisect", str(control))
    assert r.returncode == 4 and "nothing to bisect" not in r.stdout + r.stderr


def test_bad_condition(tmp_path):
    path = _probe_dir(tmp_path, divergent=True)
    r = nondet("bisect", str(path), "--condition", "bs9/ends")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"nondet: error: --condition bs9/ends: no such condition in {path}; "
                                "divergent conditions: default/bs4/last")


def test_help_imports_no_torch():
    code = ("import sys; sys.argv=['nondet', 'bisect', '--help']\n"
            "from nondet.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('torch', 'transformers', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "RUN_DIR" in out.stdout


def test_bisect_runs_probe_first(tmp_path, default_model_dir):
    """No RUN_DIR: probe the embedded default first, then bisect it; tables on stdout. One norm is
    batch-variant on purpose, so the probe finds a divergence within 3 tokens on every host."""
    out = tmp_path / "run"
    r = nondet("bisect", "--batch-sizes", "1,8", "--max-new-tokens", "3", "--no-ablation", "--out", str(out),
               "--inject-variance")
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "bisect.json").read_text())
    origin, lasting = data["origin"], data["lasting"]
    first = "origin" if lasting and (lasting["step"], lasting["order"]) == (origin["step"], origin["order"]) else \
        "first difference"
    assert f"{first}: step {origin['step']}, {origin['module']} (op class {origin['op_class']}" in r.stdout
    assert "first differing modules" in r.stdout and f"run directory: {out}" in r.stdout
    assert (out / "bisect_modules.csv").is_file() and data["ablation"] == []


def test_model_option_with_run_dir(tmp_path):
    r = nondet("bisect", str(tmp_path), "--model", "x")
    assert r.returncode == 2
    assert r.stderr.strip() == ("nondet: error: --model, --prompt, --prompt-file and --out apply only without "
                                "RUN_DIR (bisect reloads the probe's model and prompt from RUN_DIR/config.json)")


def test_bisect_without_run_dir_probes_the_trained_demo_as_probe_does(monkeypatch, tmp_path):
    """No RUN_DIR, no model, no prompt: the probe first is `nondet probe`'s demo probe (its chat-formatted
    questions, batch sizes and length), not the one-prompt sweep of another model."""
    import nondet.cli.probe as probe_cli
    from nondet.cli.bisect import _probe_first
    from nondet.probes.models import demo_model

    seen = []
    monkeypatch.setattr(demo_model, "demo_kind", lambda: "trained")
    monkeypatch.setattr(probe_cli, "run_with_progress", lambda config, quiet: seen.append(config) or 1 / 0)
    options = dict(dtype="bfloat16", device="cpu", attn_implementation=None, trust_remote_code=False,
                   inject_variance=None, threads=None, out=tmp_path / "run")
    try:
        _probe_first(None, None, True, model=None, batch_sizes=None, max_new_tokens=None, **options)
    except ZeroDivisionError:
        pass
    config = seen[0]
    assert (config.prompt, *config.prompts[1:]) == demo_model.DEMO_QUESTIONS and config.chat
    assert config.batch_sizes == (1, 4) and config.max_new_tokens == demo_model.DEMO_MAX_NEW_TOKENS
