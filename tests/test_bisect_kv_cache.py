"""bisect replays a probe's run on the KV cache it decoded on: a static cache (`--kv-cache static`, `--cuda-graphs`,
`--compile`) of the probe's length, prompt + its max_new_tokens, however few steps the replay takes.

The control of each test fires on this host: the default kernels give the random demo in fp32 other bits on a
static cache than on the dynamic one (tests/test_probe_kv_cache.py), and the length test's control is the cache
a replay of the horizon alone would have had.
"""

import functools
import json

import pytest
from controls import require_variance
from model_fixtures import cache_lengths

from nondet.probes.bisect.bisect import BisectConfig, replay_cache
from nondet.probes.bisect_probe import run_bisect
from nondet.probes.core.batch import Batch, tokenize_inputs
from nondet.probes.core.numerics import numerics_scope
from nondet.probes.core.replay import DecodeSettings, generate, new_recorder
from nondet.probes.core.static_caches import reusable_static_cache
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.probe import ProbeConfig, run_probe
from nondet.rundir.reader import read_stream_dicts
from nondet.rundir import RunDir

TOKENS = 12  # the probe's new tokens; bisect replays fewer (--max-steps)
SPEC = ModelSpec(dtype="float32", inject_variance=True)


@pytest.fixture(scope="module")
def static_run(tmp_path_factory, default_model_dir):
    """A `--kv-cache static` probe of the random demo in fp32 with the injected norm: the default diverges."""
    out = tmp_path_factory.mktemp("bisect-kv") / "run"
    run_probe(ProbeConfig(prompt="Tell me about Richard Feynman", model=SPEC, batch_sizes=(1, 2), kernels=("default",),
                          max_new_tokens=TOKENS, kv_cache="static", out=str(out)))
    return out


def _reference_bits(run) -> list[tuple]:
    ref = next(s for s in read_stream_dicts(RunDir(run)) if s["is_reference"])
    return [(s["token"], s["logprob"]) for s in ref["steps"]]


@functools.cache
def _probe_model(run) -> tuple:
    """(the run's model loaded as the probe loaded it, the prompt's ids, the run's thread count), once per run."""
    config = json.loads((run / "config.json").read_text())["config"]
    loaded = load_model(ModelSpec(**config["model"]))
    ids, _ = tokenize_inputs(loaded.tokenizer, config["prompt"], config["fillers"])
    return loaded, ids, config.get("threads")


def _replayed_reference(run, settings: DecodeSettings) -> list[tuple]:
    """The prompt alone decoded as bisect's replay decodes it (replay.generate), its (token, logprob bits)."""
    loaded, ids, threads = _probe_model(run)
    batch = Batch([ids], [[1] * len(ids)], (0,))
    with numerics_scope(threads):
        recorder = new_recorder(batch, settings)
        generate(loaded.model, loaded.tokenizer, batch, settings, recorder)
    return [(s["token"], s["logprob"]) for s in recorder.steps[0]]


def test_bisect_of_a_static_cache_run_reproduces_its_reference_bits(static_run):
    probe_bits = _reference_bits(static_run)
    # the control: the dynamic cache (what bisect replayed every run on before) gives this host other bits
    require_variance(probe_bits, _replayed_reference(static_run, DecodeSettings(TOKENS, 0.0, 0)),
                     "the static vs the dynamic cache's reference")
    result = run_bisect(BisectConfig(str(static_run), ablation=False, max_steps=4)).bisect
    assert result["reference_reproduced"] is True and result["reference_bits_reproduced"] is True
    assert result["replay"] == {"kv_cache": "static", "cache_tokens": TOKENS, "probe_compiled": False}
    assert result["first_numeric_step"] is not None  # the injected norm's divergence, found on the replay


def test_a_shorter_replay_keeps_the_probes_cache_length(static_run):
    """bisect replays up to the flip; the static cache still holds prompt + the probe's tokens (how a kernel splits
    attention's sums may follow the cache's length; on this host and on an H200 the bits did not change with it,
    so this test checks the length). Control: the same call without the probe's length gets the horizon's."""
    own = 0 if reusable_static_cache() else -1  # the held cache: prompt + new tokens; before 5.24 generate's, one less
    loaded, ids, _ = _probe_model(static_run)
    with cache_lengths(loaded.model) as lengths:
        kept = _replayed_reference(static_run, DecodeSettings(4, 0.0, 0, kv_cache="static", cache_tokens=TOKENS))
    assert len(kept) == 4 and set(lengths) == {len(ids) + TOKENS + own}
    assert kept == _reference_bits(static_run)[:4]
    with cache_lengths(loaded.model) as lengths:
        _replayed_reference(static_run, DecodeSettings(4, 0.0, 0, kv_cache="static"))
    assert set(lengths) == {len(ids) + 4 + own}  # the control: the horizon's length


def test_replay_cache_follows_the_probes_decode_path():
    assert replay_cache({"kv_cache": "dynamic", "max_new_tokens": 50}) == {}
    for probe in ({"kv_cache": "static"}, {"cuda_graphs": True}, {"compile_backend": "inductor"}):
        assert replay_cache({"kv_cache": "dynamic", "max_new_tokens": 50, **probe}) == \
            {"kv_cache": "static", "cache_tokens": 50}


def test_a_replay_that_is_not_the_probes_is_said_in_the_terminal_and_the_report(static_run, tmp_path):
    import shutil

    from nondet.reports.bisect_sections import bisect_blocks
    from nondet.reports.blocks import Report, Section
    from nondet.reports.markdown import render_markdown
    from nondet.reports.tables import read_tables
    from nondet.verdict import replay_line

    same = {"reference_reproduced": True, "reference_bits_reproduced": True, "replay": {"probe_compiled": False}}
    assert replay_line(same) is None
    assert "tokens differ" in replay_line({**same, "reference_reproduced": False})
    bits = {**same, "reference_bits_reproduced": False}
    assert "other logprob bits" in replay_line(bits) and "compiled" not in replay_line(bits)
    compiled = {**bits, "replay": {"probe_compiled": True}}
    assert "compiled" in replay_line(compiled)

    run = shutil.copytree(static_run, tmp_path / "run")
    b = run_bisect(BisectConfig(str(run), ablation=False, max_steps=2)).bisect
    assert replay_line(b) is None  # the static run replayed on its own cache: nothing to say
    RunDir(run).write_json("bisect.json", {**b, **compiled})  # as a compiled probe's replay would write it
    md = render_markdown(Report("r", [Section("bisect", "b", bisect_blocks(read_tables(run), []))]))
    assert "The replayed reference has the probe's tokens but other logprob bits (the probe's decode steps were " \
           "compiled" in md
