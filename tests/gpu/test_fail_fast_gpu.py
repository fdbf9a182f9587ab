"""--fail-fast on CUDA (probes/core/settled.py): eager and from CUDA graphs, the injected variance fails as the full
run does and the batched calls stop early; the mode passes with the full run's streams. On CUDA generate reads its
stop flag a step late only for calls without criteria of their own (core/deferred_stop.py), so the stopped call
must still end at the step the criterion settled."""

import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

STEPS = 24
PROMPTS = ("Tell me about Richard Feynman", "The quick brown fox jumps over", "One two three four five six")


def _run(gpu_model_dir, out, kernels: str, cuda_graphs: bool, rule):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    return run_probe(ProbeConfig(prompts=PROMPTS, batch_sizes=(1, 2, 4), max_new_tokens=STEPS, kernels=(kernels,),
                                 model=ModelSpec(name=str(gpu_model_dir), device="cuda", inject_variance=True),
                                 cuda_graphs=cuda_graphs, out=str(out), fail_fast=rule))


def _streams(result) -> list[dict]:
    return [json.loads(line) for line in (result.run_dir / "streams.jsonl").read_text().splitlines()]


def _judged(result):
    from nondet.gate.policy import Policy, evaluate

    verdict = evaluate(result.summary, _streams(result), Policy())
    return verdict.passed, {c.condition_id: (c.passed, c.first_numeric_divergence) for c in verdict.conditions}


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_the_injected_variance_fails_as_the_full_run_and_stops(gpu_model_dir, tmp_path, cuda_graphs):
    from nondet.probes.core.settled import STOPPED

    full = _run(gpu_model_dir, tmp_path / "full", "default", cuda_graphs, None)
    fast = _run(gpu_model_dir, tmp_path / "fast", "default", cuda_graphs, "identical")
    assert _judged(full)[0] is False and _judged(fast) == _judged(full)
    batched = [s for s in _streams(fast) if not s["is_reference"]]
    assert any(s["finish"] == STOPPED for s in batched)
    # each stopped stream ends where its call's last row settled: no row decoded past the latest first difference
    latest = max(c["first_numeric_divergence"] for c in fast.summary["modes"]["default"]["conditions"]
                 if c["first_numeric_divergence"] is not None)
    assert all(len(s["steps"]) <= latest + 1 for s in batched if s["finish"] == STOPPED)


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_the_mode_passes_with_the_full_runs_streams(gpu_model_dir, tmp_path, cuda_graphs):
    full = _run(gpu_model_dir, tmp_path / "full", "batch-invariant", cuda_graphs, None)
    fast = _run(gpu_model_dir, tmp_path / "fast", "batch-invariant", cuda_graphs, "identical")
    assert _judged(fast)[0] is True and _judged(full)[0] is True
    assert _streams(fast) == _streams(full)
