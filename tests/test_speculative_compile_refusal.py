"""`probe --speculative --compile` on a model with sliding-window layers (static_caches.uncroppable_layer).

transformers' static cache of a sliding-window layer holds only its window; once the cache is longer
than the window it cannot be cropped back after a verification pass, and assisted decoding raises at
the first one. The probe refuses that up front, in one line (exit 2), before any condition runs.
Positive: tiny gpt-oss (window 8) on the CLI, and every sliding family's cache past its window.
Negative: the same caches within the window, dense families at any length, a dense target with
--compile (a sliding draft there keeps transformers' assistant), and a gpt-oss whose window covers
the cache decoding speculatively on the compiled path.
"""

import json
import shutil
from types import SimpleNamespace

import pytest

from nondet.probes.core.static_caches import Uncroppable, reusable_static_cache, uncroppable_layer
import cli_runner

pytestmark = pytest.mark.skipif(not reusable_static_cache(), reason="transformers' static cache cannot crop")

PROMPT = "Tell me about Richard Feynman"
WINDOW = 8  # family_models' sliding window


@pytest.fixture(scope="module")
def tokenizer():
    from nondet.probes.models.default_model import build_tokenizer

    return build_tokenizer(512)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory, tokenizer):
    from family_models import save_family

    return save_family("gpt-oss", tmp_path_factory.mktemp("gpt-oss"), tokenizer)


def config_only(family: str):
    """A stand-in model holding the family's config only (uncroppable_layer reads model.config)."""
    from family_models import _configs

    return SimpleNamespace(config=_configs()[family]())


@pytest.mark.parametrize("family", ["gpt-oss", "gemma2", "gemma3", "mistral"])
def test_a_sliding_layer_cannot_crop_a_cache_longer_than_its_window(family):
    model = config_only(family)
    assert uncroppable_layer(model, WINDOW + 1) == Uncroppable(0, "sliding_attention", WINDOW)
    assert uncroppable_layer(model, WINDOW) is None


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_dense_layers_crop_at_any_length(family):
    assert uncroppable_layer(config_only(family), 4096) is None


def test_cli_refuses_a_sliding_window_model_in_one_line_before_any_condition(tmp_path, gpt_oss, tokenizer):
    from nondet.probes.core.batch import tokenize_inputs

    cache = len(tokenize_inputs(tokenizer, PROMPT, ())[0]) + 8 + 3 + 1  # prompt + -n + K + 1
    out = tmp_path / "r"
    r = cli_runner.run(["probe", "-m", gpt_oss, "-p", PROMPT, "-n", "8", "--speculative", f"self:3,draft:{gpt_oss}:3", "--compile", "--out", str(out)], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr  # above the line: transformers' own config warnings only
    assert r.stderr.splitlines()[-1] == (
        f"nondet: error: --speculative with --compile: layer 0 of {gpt_oss} is a sliding-window attention layer "
        f"(layer type 'sliding_attention', window 8 tokens, cache {cache}); transformers' static cache cannot crop "
        "it for the verification pass; rerun without --compile, or with prompt + --max-new-tokens + K + 1 <= 8 tokens")
    assert not out.exists()  # refused in open(): no run directory, no condition


def test_a_dense_target_passes_and_a_sliding_draft_keeps_transformers_assistant(tiny_model_dir, gpt_oss):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig
    from nondet.probes.speculative.source import SpeculativeSource

    tiny_model_dir = str(tiny_model_dir)
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(tiny_model_dir), max_new_tokens=8, kernels=("default",),
                         speculative=(f"draft:{gpt_oss}:3", f"draft:{tiny_model_dir}:3"), compile_backend="aot_eager")
    decode = SpeculativeSource(config).open().fingerprint["speculative"]["draft_decode"]
    assert decode == {
        f"draft:{gpt_oss}:3": "eager, dynamic KV cache (transformers' assistant): its layer 0 ('sliding_attention', "
                              "window 8) cannot be cropped in a static cache",
        f"draft:{tiny_model_dir}:3": "compiled where the target is, static KV cache (nondet's StaticDraft)",
    }


def test_a_window_that_covers_the_cache_decodes_speculatively_compiled(tmp_path, gpt_oss):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    wide = shutil.copytree(gpt_oss, tmp_path / "wide")  # the same model, window 64 >= the cache's 6 + 4 + 2 + 1
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "sliding_window": 64}))
    result = run_probe(ProbeConfig(prompt=PROMPT, model=ModelSpec(str(wide)), max_new_tokens=4, kernels=("default",),
                                   speculative=("self:2",), compile_backend="aot_eager", out=str(tmp_path / "r")))
    path = result.summary["decode_path"]["modes"]["default"]
    assert path["path"] == "compiled" and path["conditions"] == 2
    assert result.summary["speculative"]["forms"] == ["self:2"]
