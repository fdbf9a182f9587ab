"""pytest plugin (entry point `pytest11`): assert that a model in memory is batch-invariant.

    def test_my_model_is_batch_invariant(assert_batch_invariant):
        model, tokenizer = load_my_model()
        assert_batch_invariant(model, tokenizer, prompts=["Tell me about Richard Feynman"],
                               batch_sizes=(1, 8, 16), max_new_tokens=100,
                               kernels="batch-invariant")

or, without the fixture, `from nondet.pytest_plugin import assert_batch_invariant`.
A violation raises AssertionError whose message names each failing condition's first
divergence and branch tokens. This module loads in every pytest run of an environment
where nondet is installed, so it imports no torch (nor anything heavy) at import time.
"""

from typing import Sequence

import pytest

DEFAULT_PROMPTS = ("Tell me about Richard Feynman",)


def assert_batch_invariant(model, tokenizer, prompts: Sequence[str] = DEFAULT_PROMPTS,
                           batch_sizes: Sequence[int] = (1, 8, 16), max_new_tokens: int = 64,
                           kernels: str = "default", require: str = "identical"):
    """Probe (model, tokenizer) in memory under the policy; AssertionError on a violation.

    kernels: "default" (the model as it is) or "batch-invariant" (nondet's kernels).
    require: "identical" or one of "max-distinct = N", "min-divergence-step = S",
    "max-logprob-diff = X" (see nondet gate). Returns the verdicts when the policy is met.
    """
    from nondet.probes.inmemory import probe_model
    from nondet.probes.probe import ProbeConfig
    from nondet.gate.policy import Policy, evaluate

    policy = Policy.parse(require)
    verdicts = []
    for prompt in prompts:
        config = ProbeConfig(prompt=prompt, batch_sizes=tuple(sorted({1, *batch_sizes})),
                             max_new_tokens=max_new_tokens, kernels=(kernels,))
        result = probe_model(model, tokenizer, config)
        verdicts.append(evaluate(result.summary, result.streams, policy, name=f"prompt {prompt[:60]!r}"))
    failed = [v for v in verdicts if not v.passed]
    if failed:
        raise AssertionError(failure_message(failed))
    return verdicts


def failure_message(verdicts) -> str:
    """'batch-variant under policy identical:' then one line per failing condition."""
    lines = [f"batch-variant under policy {verdicts[0].policy.describe()}:"]
    for v in verdicts:
        for c in v.failures:
            lines.append(f"  {v.name}, {c.condition_id}: {c.message}")
    return "\n".join(lines)


@pytest.fixture(name="assert_batch_invariant")
def _assert_batch_invariant_fixture():
    """The assert_batch_invariant helper, as a fixture."""
    return assert_batch_invariant
