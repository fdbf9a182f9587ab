"""`nondet gate --prefix-cache / --chunked-prefill`: the batch axis also runs each prompt alone with its
prefill cut into forwards on the cache, and its policy judges those conditions like the batches.
Positive control: default kernels on an fp32 Qwen3 whose split prefill changes the bits on this host
(the same case as test_prefill_axis.py; skipped with the reason where it does not); negative: the mode."""

import json

import pytest
from controls import FIX_KERNELS, SKIP_PREFIX

import cli_runner
from nondet.errors import UsageError
from nondet.gate.config import resolve

PROMPT = "Tell me about Richard Feynman and the Manhattan Project, then about quantum electrodynamics"


def test_the_settings_take_flags_and_file_values():
    assert resolve({"prefix-cache": "auto", "chunked-prefill": "4,8"}, {}).prefill == (
        "prefix:auto", "chunk:4", "chunk:8")
    assert resolve({}, {"prefix-cache": [4, 8], "chunked-prefill": 16}).prefill == ("prefix:4", "prefix:8", "chunk:16")
    assert resolve({}, {}).prefill == ()
    with pytest.raises(UsageError, match="nondet.toml: chunked-prefill: give token counts"):
        from pathlib import Path

        resolve({}, {"chunked-prefill": "zero"}, Path("nondet.toml"))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from model_fixtures import save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    return save_qwen3(tmp_path_factory.mktemp("gate-prefill"), build_tokenizer(512), hidden=256, layers=2, heads=4,
                      kv_heads=2, seed=0)


def _gate(model, out, kernels):
    return cli_runner.run(["gate", "--model", str(model), "--dtype", "float32", "--prompt", PROMPT, "-b", "1,2",
                           "-n", "8", "--prefix-cache", "5", "--chunked-prefill", "3", "--kernels", kernels, "--no-bisect",
                           "--threads", "1", "--out", str(out)])


def test_default_kernels_fail_on_a_split_and_the_mode_passes(model, tmp_path):
    done = _gate(model, tmp_path / "default", "default")
    summary = json.loads((tmp_path / "default" / "summary.json").read_text())
    splits = [c for c in summary["prefill"]["conditions"] if c["first_numeric_divergence"] is not None]
    if not splits:
        pytest.skip(f"{SKIP_PREFIX}the default kernels are invariant on the prefill splits here")
    assert done.returncode == 1 and splits[0]["condition_id"] in done.stdout, done.stdout
    fixed = _gate(model, tmp_path / "fixed", FIX_KERNELS)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    conditions = [json.loads(line)["condition_id"]
                  for line in (tmp_path / "fixed" / "conditions.jsonl").read_text().splitlines()]
    assert f"{FIX_KERNELS}/prefix/5" in conditions and f"{FIX_KERNELS}/chunk/3" in conditions
