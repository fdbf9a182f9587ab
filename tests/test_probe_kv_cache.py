"""`--kv-cache static`: a preallocated cache (the layout CUDA graphs need) measured like the dynamic one.

Under the mode a row's attention over the static cache's unfilled, masked positions adds exact
zeros, so the streams are bit-identical to the dynamic cache's; with the injected norm the
probe still finds the batch variance (positive control, any machine). Each invariance test has
its control on the same probe: the default kernels differ there (the default model in fp32: the
host's fp32 GEMMs differ between one row and several, its bf16 ones do not on AVX512 Xeons).
"""

import json

import pytest
from controls import FIX_KERNELS, require_divergence, require_variance

from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe
import cli_runner

PROMPT = "Tell me about Richard Feynman"


def probe(out, kv_cache, kernels=("default", FIX_KERNELS), inject=False, dtype="float32"):
    """{kernels: (summary, {condition: steps})} of one probe at batch sizes 1, 2, 3."""
    kernels = tuple(dict.fromkeys(kernels))  # one mode when the fix is the default (controls.WITHOUT_MODE)
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(dtype=dtype, inject_variance=inject), batch_sizes=(1, 2, 3),
                         max_new_tokens=12, kernels=kernels, kv_cache=kv_cache, out=str(out))
    result = run_probe(config)
    streams = [json.loads(line) for line in (result.run_dir / "streams.jsonl").read_text().splitlines()]
    return {k: (result.summary["modes"][k], {s["condition_id"]: s["steps"] for s in streams if s["kernels"] == k})
            for k in kernels}


@pytest.fixture(scope="module")
def static_and_dynamic(tmp_path_factory, default_model_dir):
    """The static and the dynamic cache's probes, each with the default kernels and the mode."""
    out = tmp_path_factory.mktemp("kv")
    return {kv: probe(out / kv, kv) for kv in ("static", "dynamic")}, out


def test_static_cache_is_batch_invariant_under_the_mode(static_and_dynamic):
    runs, out = static_and_dynamic
    require_divergence(runs["static"]["default"][0], "the static cache's probe at batch sizes 1, 2, 3")
    static = runs["static"][FIX_KERNELS][0]
    assert static["distinct_completions"] == 1 and static["first_numeric_divergence"] is None
    header = json.loads((out / "static" / "config.json").read_text())
    assert header["config"]["kv_cache"] == "static"


def test_static_cache_gives_the_dynamic_caches_bits_under_the_mode(static_and_dynamic):
    runs, _ = static_and_dynamic
    require_variance(runs["static"]["default"][1], runs["dynamic"]["default"][1],
                     "the static vs the dynamic cache's streams")
    # tokens, logprob bits, top-k and margins, every condition
    assert runs["static"][FIX_KERNELS][1] == runs["dynamic"][FIX_KERNELS][1]


def test_static_cache_still_finds_injected_variance(tmp_path, default_model_dir):
    found, _ = probe(tmp_path / "inject", "static", kernels=("default",), inject=True, dtype="bfloat16")["default"]
    assert found["first_numeric_divergence"] is not None and found["first_numeric_divergence"] <= 1


@pytest.mark.parametrize("args", [["--kv-cache", "paged"], ["--kv-cache", "static", "--load", "continuous"]])
def test_bad_kv_cache_is_one_line_exit_2(tmp_path, args):
    r = cli_runner.run(["probe", "-p", PROMPT, *args, "--out", str(tmp_path / "r")], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--kv-cache must be one of dynamic, static" in r.stderr and "Traceback" not in r.stderr
