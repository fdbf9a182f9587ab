"""`--kv-cache static`: a preallocated cache (the layout CUDA graphs need) measured like the dynamic one.

Under the mode a row's attention over the static cache's unfilled, masked positions adds exact
zeros, so the streams are bit-identical to the dynamic cache's; with the injected norm the
probe still finds the batch variance (positive control, any machine).
"""

import json
import subprocess
import sys

import pytest

from nondet.probes.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

PROMPT = "Tell me about Richard Feynman"


def probe(tmp_path, name, kv_cache, kernels="batch-invariant", inject=False):
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(inject_variance=inject), batch_sizes=(1, 2, 3),
                         max_new_tokens=12, kernels=(kernels,), kv_cache=kv_cache, out=str(tmp_path / name))
    result = run_probe(config)
    streams = [json.loads(line) for line in (result.run_dir / "streams.jsonl").read_text().splitlines()]
    return result.summary["modes"][kernels], {s["condition_id"]: s["steps"] for s in streams}


def test_static_cache_gives_the_dynamic_caches_bits_under_the_mode(tmp_path, default_model_dir):
    static, static_steps = probe(tmp_path, "static", "static")
    dynamic, dynamic_steps = probe(tmp_path, "dynamic", "dynamic")
    assert static["distinct_completions"] == 1 and static["first_numeric_divergence"] is None
    assert static_steps == dynamic_steps  # tokens, logprob bits, top-k and margins, every condition
    header = json.loads((tmp_path / "static" / "config.json").read_text())
    assert header["config"]["kv_cache"] == "static"


def test_static_cache_still_finds_injected_variance(tmp_path, default_model_dir):
    found, _ = probe(tmp_path, "inject", "static", kernels="default", inject=True)
    assert found["first_numeric_divergence"] is not None and found["first_numeric_divergence"] <= 1


@pytest.mark.parametrize("args", [["--kv-cache", "paged"], ["--kv-cache", "static", "--load", "continuous"]])
def test_bad_kv_cache_is_one_line_exit_2(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "nondet", "probe", "-p", PROMPT, *args, "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--kv-cache must be one of dynamic, static" in r.stderr and "Traceback" not in r.stderr
