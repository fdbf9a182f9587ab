"""bisect of a `--cuda-graphs` probe on a GPU: the eager replay on a static cache of the probe's length gives the
reference the probe's logprob bits (the graphs replay eager kernels). Controls, where they fire on this GPU: the
dynamic cache, and a static cache of the replay's own horizon, give other bits."""

import pytest
from controls import require_variance
from test_bisect_kv_cache import _reference_bits, _replayed_reference

pytestmark = pytest.mark.gpu

TOKENS = 512  # the probe's new tokens: a static cache far longer than bisect's horizon
HORIZON = 8


@pytest.fixture(scope="module")
def graphs_run(gpu_model_dir, tmp_path_factory):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    out = tmp_path_factory.mktemp("bisect-graphs") / "run"
    run_probe(ProbeConfig(model=ModelSpec(name=str(gpu_model_dir), device="cuda", inject_variance=True),
                          prompt="Tell me about Richard Feynman", batch_sizes=(1, 4), max_new_tokens=TOKENS,
                          kernels=("default",), cuda_graphs=True, out=str(out)))
    return out


def test_bisect_reproduces_the_graphs_reference_bits(graphs_run):
    from nondet.probes.bisect.bisect import BisectConfig
    from nondet.probes.bisect_probe import run_bisect

    result = run_bisect(BisectConfig(str(graphs_run), ablation=False, max_steps=HORIZON)).bisect
    assert result["reference_reproduced"] is True and result["reference_bits_reproduced"] is True
    assert result["replay"] == {"kv_cache": "static", "cache_tokens": TOKENS, "probe_compiled": False}
    assert result["first_numeric_step"] is not None  # the injected norm, found on the replay


def test_control_the_dynamic_cache_and_the_horizons_length_give_other_bits(graphs_run):
    from nondet.probes.core.replay import DecodeSettings

    probe_bits = _reference_bits(graphs_run)[:HORIZON]
    kept = _replayed_reference(graphs_run, DecodeSettings(HORIZON, 0.0, 0, kv_cache="static", cache_tokens=TOKENS))
    assert kept == probe_bits
    dynamic = _replayed_reference(graphs_run, DecodeSettings(HORIZON, 0.0, 0))
    horizon = _replayed_reference(graphs_run, DecodeSettings(HORIZON, 0.0, 0, kv_cache="static"))
    require_variance([probe_bits, probe_bits], [dynamic, horizon], "the probe's static cache vs the dynamic one "
                     "and one of the horizon's length")
    print(f"dynamic cache other bits: {dynamic != probe_bits}; horizon's length other bits: {horizon != probe_bits}")
