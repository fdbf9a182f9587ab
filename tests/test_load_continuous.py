"""`--load continuous`: the target inside transformers' continuous-batching engine, in process."""

import json
import os

import pytest

from nondet.probes.core.load_config import LoadConfig
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe
import cli_runner


def continuous(out, **kw):
    load = LoadConfig(mode="continuous", **kw.pop("load", {}))
    return run_probe(ProbeConfig(out=str(out), load=load, **kw))


@pytest.mark.slow
def test_continuous_load_diverges_on_embedded_default(tmp_path):
    # Positive control: fillers joining and leaving the engine's batch change the target's bits.
    # One norm is batch-variant on purpose (the engine packs a step's rows into one call), so
    # this holds on every host; tokens may or may not flip within 100 steps, by host.
    result = continuous(tmp_path / "run", runs=2, max_new_tokens=100, model=ModelSpec(inject_variance=True))
    m = result.summary["modes"]["default"]
    assert m["n_runs"] == 3
    assert m["first_numeric_divergence"] is not None
    if m["distinct_completions"] >= 2:
        assert m["first_numeric_divergence"] <= m["first_token_divergence"] < 100
        tree = m["branch_tree"]
        assert tree["step"] == m["first_token_divergence"] and any(a["is_reference"] for a in tree["alternatives"])
    assert result.summary["load"]["compare_level"] == "logits"
    conditions = [json.loads(x) for x in (tmp_path / "run" / "conditions.jsonl").read_text().splitlines()]
    assert [c["condition_id"] for c in conditions] == ["default/cb/ref", "default/cb/run1", "default/cb/run2"]
    assert conditions[0]["batch_size"] == 1 and all(c["batch_size"] > 2 for c in conditions[1:])
    stream = json.loads((tmp_path / "run" / "streams.jsonl").read_text().splitlines()[1])
    assert stream["load"] == "continuous" and max(stream["batch_requests"]) > 2
    step = stream["steps"][0]
    assert len(step["top"]) == 5 and float.fromhex(step["margin"]) >= 0 and float.fromhex(step["logprob"]) <= 0


def test_engine_replay_is_deterministic_and_invariant_kernels_hold_under_load(tiny_model_dir, tmp_path):
    settings = dict(model=ModelSpec(name=str(tiny_model_dir)), runs=1, max_new_tokens=8,
                    load={"concurrency": 4, "filler_requests": 6})
    both = continuous(tmp_path / "both", kernels=("default", "batch-invariant"), **settings)
    default, invariant = both.summary["modes"]["default"], both.summary["modes"]["batch-invariant"]
    assert default["first_numeric_divergence"] is not None  # the load changes the bits...
    assert invariant["distinct_completions"] == 1 and invariant["first_numeric_divergence"] is None  # ...not here
    assert any("attention per request" in n for n in both.summary["load"]["notes"])
    # Negative control: the same seeded schedule replays to the same bits.
    again = continuous(tmp_path / "again", **settings)
    first = [s for s in map(json.loads, (tmp_path / "both" / "streams.jsonl").read_text().splitlines())
             if s["kernels"] == "default"]
    second = list(map(json.loads, (tmp_path / "again" / "streams.jsonl").read_text().splitlines()))
    assert [s["steps"] for s in first] == [s["steps"] for s in second]
    assert again.summary["modes"]["default"]["runs"] == default["runs"]


def test_continuous_rejects_sampling():
    r = cli_runner.run(["probe", "--load", "continuous", "--temperature", "0.7"], env=dict(os.environ), timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == "nondet: error: --load continuous replays greedy decoding only; drop --temperature"
