"""`nondet compare`: two run directories compared
stream by stream, bit for bit, and their environments on the settings that can move bits."""

import json
import os
from pathlib import Path
import cli_runner


def _run_dir(path: Path, logprobs: list[list[str]], tokens: list[list[int]], fingerprint: dict | None = None,
             config: dict | None = None) -> str:
    path.mkdir()
    if fingerprint is not None:
        (path / "fingerprint.json").write_text(json.dumps(fingerprint))
    if config is not None:
        (path / "config.json").write_text(json.dumps({"command": "probe", "config": config}))
    records = [{"run_id": i, "condition_id": f"batch-invariant/bs{1 + 7 * i}/ends", "kernels": "batch-invariant",
                "position": 0, "is_reference": i == 0, "prompt_id": 0,
                "steps": [{"token": t, "logprob": lp} for t, lp in zip(toks, lps)]}
               for i, (toks, lps) in enumerate(zip(tokens, logprobs))]
    (path / "streams.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.json").write_text('{"modes": {}}')  # a finished run: compare refuses an unfinished one
    return str(path)


def _compare(a: str, b: str):
    # no COLUMNS (readline may have set it for child processes): a log's lines whole, as asserted below;
    # tests/test_columns80.py folds them at COLUMNS=80
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = cli_runner.run(["compare", a, b], timeout=120, env=env)
    return proc.returncode, proc.stdout + proc.stderr


LPS = [["-0x1.8p-1", "-0x1.0p-2", "-0x1.4p-3"], ["-0x1.8p-1", "-0x1.0p-2", "-0x1.4p-3"]]
TOKS = [[5, 9, 11], [5, 9, 11]]


def test_identical_runs_pass(tmp_path):
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS), _run_dir(tmp_path / "b", LPS, TOKS))
    assert code == 0 and out.strip() == "2 of 2 streams bitwise equal"


def test_one_logprob_bit_and_one_token_are_found(tmp_path):
    bits = [LPS[0], ["-0x1.8p-1", "-0x1.0000000000001p-2", "-0x1.4p-3"]]  # one ULP at step 1 of the bs8 stream
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS), _run_dir(tmp_path / "b", bits, TOKS))
    assert code == 1
    assert "batch-invariant/bs8/ends row 0 prompt 0: first token divergence None, first logprob-bits divergence 1" in out
    assert out.strip().endswith("1 of 2 streams bitwise equal")
    code, out = _compare(_run_dir(tmp_path / "c", LPS, TOKS), _run_dir(tmp_path / "d", LPS, [TOKS[0], [5, 9, 12]]))
    assert code == 1 and "first token divergence 2" in out


def test_a_run_against_itself_is_refused(tmp_path):
    a = _run_dir(tmp_path / "a", LPS, TOKS)
    code, out = _compare(a, str(tmp_path / "." / "a"))  # the same directory, spelled otherwise
    assert code == 2 and out == f"nondet: error: {a} and {tmp_path / '.' / 'a'} are the same run directory: it would " \
                                 "equal itself; compare two runs of the probe (another machine's, or another day's)\n"


def test_a_missing_run_directory_is_one_line_exit_4(tmp_path):
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS), str(tmp_path / "nowhere"))
    assert code == 4 and len(out.strip().splitlines()) == 1 and out.startswith("nondet: error: run directory not found")


def test_a_stream_without_its_twin_fails(tmp_path):
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS), _run_dir(tmp_path / "b", LPS[:1], TOKS[:1]))
    assert code == 1 and "batch-invariant/bs8/ends row 0 prompt 0: not in" in out
    assert out.strip().endswith("1 of 2 streams bitwise equal")


FP = {"device": "NVIDIA H100 80GB HBM3", "cpu_capability": "AVX2", "torch": "2.11.0", "kernels": "batch-invariant",
      "threads": 16, "model": {"name": "/data/m", "architecture": "Qwen3ForCausalLM", "layers": 8, "hidden": 1024,
                               "vocab": 151936, "params": 596049920}}


def test_environments_that_differ_are_named_first(tmp_path):
    # Positive control: another instruction set (and another device) is named with both values, before
    # the verdict; threads are no numeric setting and stay out.
    other = {**FP, "device": "NVIDIA H200", "cpu_capability": "DEFAULT", "threads": 8,
             "model": {**FP["model"], "name": "/elsewhere/m", "layers": 4}}
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS, FP), _run_dir(tmp_path / "b", LPS, TOKS, other))
    lines = out.strip().splitlines()
    assert code == 0 and lines[-1] == "2 of 2 streams bitwise equal"
    assert lines[0] == ("environments differ in device: NVIDIA H100 80GB HBM3 | NVIDIA H200; "
                        "cpu_capability: AVX2 | DEFAULT; model: Qwen3ForCausalLM 8 1024 151936 596049920 | "
                        "Qwen3ForCausalLM 4 1024 151936 596049920")


def test_equal_environments_add_no_line(tmp_path):
    # Negative control: the same fingerprint but for threads and the model's directory prints the verdict alone.
    other = {**FP, "threads": 2, "model": {**FP["model"], "name": "/elsewhere/m"}}
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS, FP), _run_dir(tmp_path / "b", LPS, TOKS, other))
    assert code == 0 and out.strip() == "2 of 2 streams bitwise equal"


CONFIG = {"prompt": "hi", "batch_sizes": [1, 8], "max_new_tokens": 3, "seed": 0, "model": {"name": "/data/a"},
          "fillers": ["a filler long enough " * 6], "out": "/runs/a", "threads": 16}


def test_probe_settings_that_differ_are_named_and_long_values_shortened(tmp_path):
    # Positive control: another token count and other fillers are named (the fillers too long for the line).
    other = {**CONFIG, "max_new_tokens": 4, "fillers": ["another filler " * 8]}
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS, config=CONFIG),
                         _run_dir(tmp_path / "b", LPS, TOKS, config=other))
    assert out.splitlines()[0] == "probe settings differ in fillers (differs); max_new_tokens: 3 | 4"


def test_a_model_elsewhere_and_another_out_are_no_probe_difference(tmp_path):
    # Negative control: the same weights in another directory, another --out and threads add no line.
    other = {**CONFIG, "model": {"name": "/mnt/b"}, "out": "/runs/b", "threads": 2}
    code, out = _compare(_run_dir(tmp_path / "a", LPS, TOKS, config=CONFIG),
                         _run_dir(tmp_path / "b", LPS, TOKS, config=other))
    assert code == 0 and out.strip() == "2 of 2 streams bitwise equal"
