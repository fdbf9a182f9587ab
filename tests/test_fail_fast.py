"""--fail-fast: batched calls stop at their rows' settled verdicts (probes/core/settled.py).

The stop must never change a verdict: on the same model and host, each policy judges a fail-fast run
as it judges the full run (the injected variance fails both, the mode passes both), a failing
condition names the same first difference, and a passing run is the full run byte for byte. The
criterion itself is checked against references step by step, and the diff reads a stopped stream's
end as not seen, never as a divergence (a stream that ends early without the mark still is one)."""

import json
from dataclasses import replace

import pytest

from nondet.errors import UsageError
from nondet.gate.policy import Policy, evaluate
from nondet.probes.core.confidence import prompt_confidence
from nondet.probes.core.diff import first_token_divergence, summarize
from nondet.probes.core.settled import STOPPED, StopRule, mark_stopped, settled_criterion
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe, validate_config
from nondet.probes.static import workers

PROMPTS = ("The capital of France is", "One two three four five", "Zebra crossing near the old")
TOKENS = 12


# -- the criterion, step by step ------------------------------------------------------------

class _Recorder:
    """What the criterion reads of a StepRecorder: the target rows and the last step's tensors."""

    def __init__(self, rows):
        self.target_rows = tuple(rows)
        self.step = -1
        self.now = None

    def record(self, tokens, logprobs):
        import torch

        self.step += 1
        self.now = (torch.tensor(tokens), torch.tensor(logprobs, dtype=torch.float32))

    def latest(self):
        return (*self.now, self.step)


def _steps(tokens, logprobs):
    """Reference steps as the recorder keeps them: fp32 logprobs as float.hex."""
    import numpy as np

    return [{"token": t, "logprob": float(np.float32(lp)).hex()} for t, lp in zip(tokens, logprobs)]


def _walk(rule: str, references: dict, run: list[tuple[list[int], list[float]]]) -> int | None:
    """Feed the steps of `run` (per step: tokens and logprobs of the rows) to the criterion; the step at
    which it stops the call, or None when it never does."""
    import numpy as np
    import torch

    recorder = _Recorder(references)
    criterion = settled_criterion(StopRule.parse(rule), references, recorder)
    for step, (tokens, logprobs) in enumerate(run):
        recorder.record(tokens, [float(np.float32(x)) for x in logprobs])
        done = criterion(torch.zeros((len(tokens), 1)), None)
        assert done.shape == (len(tokens),) and (bool(done.all()) or not bool(done.any()))  # whole call or nothing
        if bool(done.all()):
            assert criterion.fired
            return step
    assert not criterion.fired
    return None


REF = {0: _steps([5, 6, 7, 8, 9], [-1.0, -0.5, -0.25, -2.0, -1.5]),
       1: _steps([4, 4, 4, 4, 4], [-0.1, -0.2, -0.3, -0.4, -0.5])}
LAST = 4  # REF's last step: a call stopped there had nothing left to decode


def _same_until(step_a: int, step_b: int, delta: float = 1e-3, token_flip: int | None = None):
    """A run of REF's rows where row 0's logprob moves by delta from step_a, row 1's from step_b, and row 0's
    token changes at token_flip."""
    run = []
    for t in range(5):
        tokens = [REF[0][t]["token"] if t != token_flip else 99, REF[1][t]["token"]]
        logprobs = [float.fromhex(REF[0][t]["logprob"]) + (delta if t >= step_a else 0),
                    float.fromhex(REF[1][t]["logprob"]) + (delta if t >= step_b else 0)]
        run.append((tokens, logprobs))
    return run


def test_identical_stops_when_the_last_row_differs():
    assert _walk("identical", REF, _same_until(1, 3)) == 3  # row 0 at step 1, row 1 at step 3
    # row 1 never differs: settled only at its reference's last step, where the call ends anyway
    assert _walk("identical", REF, _same_until(9, 9, token_flip=2)) == LAST
    assert _walk("identical", REF, _same_until(9, 9)) == LAST


def test_max_logprob_diff_stops_only_past_its_limit():
    assert _walk("max-logprob-diff = 0.01", REF, _same_until(0, 0, delta=1e-3)) == LAST
    assert _walk("max-logprob-diff = 0.01", REF, _same_until(2, 1, delta=0.1)) == 2
    assert _walk("max-logprob-diff = 0.01", REF, _same_until(9, 1, delta=0.1, token_flip=3)) == 3


def test_min_divergence_step_settles_passing_rows_at_s():
    assert _walk("min-divergence-step = 2", REF, _same_until(0, 0, delta=0.5)) == 1  # two steps agree: passed
    assert _walk("min-divergence-step = 4", REF, _same_until(9, 9, token_flip=1)) == 3  # row 0 failed, row 1 at S


def test_a_row_is_settled_at_its_references_end():
    short = {0: REF[0][:2], 1: REF[1]}
    assert _walk("identical", short, _same_until(9, 3)) == 3  # row 0 settled at step 1 (its reference ended)


@pytest.mark.parametrize("text", ["max-distinct = 2", "max-flip-rate = 0.1", "identical = 1", "max-logprob-diff",
                                  "min-divergence-step = x"])
def test_rules_that_need_whole_completions_or_values_are_refused(text):
    with pytest.raises(UsageError):
        StopRule.parse(text)


def test_only_rows_short_of_their_end_are_marked():
    rows = {0: _steps([1, 2], [-1, -1]), 1: _steps([1, 0], [-1, -1]), 2: _steps([1, 2, 3], [-1, -1, -1])}
    mark_stopped(rows, max_new_tokens=3, eos=[0])
    assert [bool(rows[r][-1].get("stopped")) for r in (0, 1, 2)] == [True, False, False]


# -- the diff reads a stopped end as not seen --------------------------------------------------

def _stream(run_id, tokens, finish="length", reference=False, condition="c"):
    return {"run_id": run_id, "condition_id": "ref" if reference else condition, "position": 0,
            "is_reference": reference, "kernels": "default", "finish": finish,
            "steps": [{"token": t, "logprob": (-1.0).hex(), "margin": (1.0).hex(), "piece": str(t)} for t in tokens]}


def test_a_stopped_prefix_is_the_references_completion_and_no_divergence():
    ref = _stream(0, [1, 2, 3, 4], reference=True)
    stopped = _stream(1, [1, 2], STOPPED)
    cut = _stream(2, [1, 2])  # the control: ended early without the mark (a real early end)
    assert first_token_divergence(ref, stopped) is None and first_token_divergence(ref, cut) == 2
    doc = summarize([ref, stopped])
    assert doc["distinct_completions"] == 1 and doc["stopped_runs"] == 1 and doc["branch_tree"] is None
    assert summarize([ref, cut])["distinct_completions"] == 2
    diverged = _stream(3, [1, 9], STOPPED)
    doc = summarize([ref, stopped, diverged])
    assert doc["distinct_completions"] == 2 and doc["first_token_divergence"] == 1
    assert [a["piece"] for a in doc["branch_tree"]["alternatives"]] == ["2", "9"]  # no "<end>" at the cut


def test_confidence_counts_undecided_runs_apart():
    ref = _stream(0, [1, 2, 3], reference=True)
    c = prompt_confidence([ref, _stream(1, [1], STOPPED), _stream(2, [1, 5], STOPPED), _stream(3, [1, 2, 3])])
    assert (c["diverged"], c["runs"], c["undecided"]) == (1, 2, 1)


# -- end to end on a saved model: the verdict is the full run's ---------------------------------

def _config(model_dir, out, rule=None, kernels=("default",), n=1) -> ProbeConfig:
    return ProbeConfig(prompts=PROMPTS, model=ModelSpec(str(model_dir), "float32", inject_variance=True),
                       batch_sizes=(1, 2, 3), max_new_tokens=TOKENS, threads=1, workers=n, out=str(out),
                       kernels=kernels, fail_fast=rule)


def _streams(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "streams.jsonl").read_text().splitlines()]


def _judged(result, policy: Policy):
    verdict = evaluate(result.summary, _streams(result.run_dir), policy)
    return verdict.passed, {c.condition_id: (c.passed, c.first_numeric_divergence) for c in verdict.conditions}


@pytest.fixture(scope="module")
def full_runs(tiny_model_dir, tmp_path_factory):
    """The injected variance under default kernels and under the mode, decoded to the end."""
    work = tmp_path_factory.mktemp("full")
    return {mode: run_probe(_config(tiny_model_dir, work / mode, kernels=(mode,)))
            for mode in ("default", "batch-invariant")}


@pytest.mark.parametrize("rule, passes", [("identical", False), ("max-logprob-diff = 1e-6", False),
                                          ("min-divergence-step = 3", True)])
def test_the_injected_variance_is_judged_as_the_full_run_and_stops_early(tiny_model_dir, tmp_path, full_runs, rule,
                                                                        passes):
    """identical and max-logprob-diff fail at the injected norm's first logprob difference (the tiny model's
    tokens never flip in 12 steps); min-divergence-step = 3 passes once 3 steps agree."""
    policy = Policy.parse(rule)
    full = _judged(full_runs["default"], policy)
    fast_run = run_probe(_config(tiny_model_dir, tmp_path / "fast", rule))
    assert full[0] is passes and _judged(fast_run, policy) == full  # the same conditions, the same first difference
    batched = [s for s in _streams(tmp_path / "fast") if not s["is_reference"]]
    assert all(s["finish"] == STOPPED and len(s["steps"]) < TOKENS for s in batched)
    if passes:
        assert {len(s["steps"]) for s in batched} == {3}
    assert fast_run.summary["modes"]["default"]["stopped_runs"] == len(batched)


def test_the_mode_passes_as_the_full_run_does_byte_for_byte(tiny_model_dir, tmp_path, full_runs):
    fast = run_probe(_config(tiny_model_dir, tmp_path / "fast", "identical", kernels=("batch-invariant",)))
    assert _judged(fast, Policy())[0] is True and _judged(full_runs["batch-invariant"], Policy())[0] is True
    assert (tmp_path / "fast" / "streams.jsonl").read_text() == \
        (full_runs["batch-invariant"].run_dir / "streams.jsonl").read_text()


@pytest.mark.parametrize("parent_decodes", [True, False])
def test_helpers_stop_as_one_process_does(tiny_model_dir, tmp_path, monkeypatch, parent_decodes):
    """With --workers a batch goes out with its references (a helper alone decodes them first)."""
    monkeypatch.setattr(workers, "PARENT_DECODES", parent_decodes)
    one = run_probe(_config(tiny_model_dir, tmp_path / "one", "identical"))
    two = run_probe(_config(tiny_model_dir, tmp_path / "two", "identical", n=2))
    assert (tmp_path / "two" / "streams.jsonl").read_text() == (tmp_path / "one" / "streams.jsonl").read_text()
    assert any(s["finish"] == STOPPED for s in _streams(tmp_path / "two"))
    assert sum(two.summary["workers"]["conditions_decoded"][1:]) > 0 or parent_decodes
    assert "workers" not in one.summary


def test_fail_fast_is_refused_where_no_static_batch_runs(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "x", "identical")
    with pytest.raises(UsageError, match="--fail-fast"):
        validate_config(replace(config, speculative=("ngram:2",), batch_sizes=(1,), prompts=()))
    with pytest.raises(UsageError, match="max-distinct"):
        validate_config(replace(config, fail_fast="max-distinct = 2"))


def test_the_gate_maps_its_batch_policy_to_the_rule_and_refuses_the_others(tiny_model_dir, tmp_path):
    from nondet.cli.gate import probe_configs
    from nondet.gate.config import resolve

    def configs(**flags):
        settings = resolve({"model": str(tiny_model_dir), "fail-fast": True, **flags}, {})
        return probe_configs(settings, str(tmp_path / "run"))

    assert [c.fail_fast for c in configs(**{"max-logprob-diff": 0.001})] == ["max-logprob-diff = 0.001"]
    assert [c.fail_fast for c in configs(**{"min-divergence-step": 50})] == ["min-divergence-step = 50"]
    assert configs()[0].fail_fast == "identical"
    for flags in ({"max-distinct": 2}, {"max-flip-rate": 0.1}):
        with pytest.raises(UsageError, match="whole completions"):
            configs(**flags)
    with pytest.raises(UsageError, match="--fail-fast applies to the batch axis"):
        resolve({"model": str(tiny_model_dir), "fail-fast": True, "speculative-forms": "ngram:2"}, {})
