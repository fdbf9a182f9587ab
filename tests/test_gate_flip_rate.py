"""The gate's max-flip-rate policy: met only when the runs rule out a higher token flip rate at 95%.

Positive controls: runs that flipped fail it, and so do too few flip-free runs (the message says how
many would decide). Negative: enough flip-free runs meet it. Pure Python on summary.json dicts, as the
gate reads them (their confidence, probes/core/confidence.py).
"""

import pytest

from nondet.errors import UsageError
from nondet.gate.policy import Policy, evaluate
from nondet.interval import runs_to_bound
from nondet.probes.core.confidence import rate_entry


def summary(diverged: int, runs: int) -> dict:
    mode = {"conditions": [], "runs": [], "first_token_divergence": 3 if diverged else None,
            "first_numeric_divergence": 1, "confidence": rate_entry(diverged, runs)}
    return {"modes": {"default": mode}}


def test_flips_fail_the_policy_naming_the_count_and_the_bound():
    v = evaluate(summary(2, 40), policy=Policy.parse("max-flip-rate = 0.1"))
    assert not v.passed
    assert "2 of 40 runs diverged: the flip rate's 95% upper bound 0.165 is not below 0.1" in v.message


def test_too_few_flip_free_runs_cannot_meet_it_and_say_how_many_would():
    v = evaluate(summary(0, 30), policy=Policy.parse("max-flip-rate = 0.05"))
    assert not v.passed  # 0 of 30: the bound is 11%
    assert f"0 of 30 runs diverged" in v.message and f"{runs_to_bound(0.05)} runs with no flip would decide" in v.message


def test_enough_flip_free_runs_meet_it():
    n = runs_to_bound(0.05)
    v = evaluate(summary(0, n), policy=Policy.parse("max-flip-rate = 0.05"))
    assert v.passed, v.message


@pytest.mark.parametrize("text", ["max-flip-rate = 0", "max-flip-rate = 1.5", "max-flip-rate"])
def test_a_rate_outside_0_1_is_a_usage_error(text):
    with pytest.raises(UsageError):
        Policy.parse(text)


def test_a_summary_without_confidence_is_a_usage_error():
    old = summary(0, 10)
    del old["modes"]["default"]["confidence"]
    with pytest.raises(UsageError, match="max-flip-rate needs summary.json's confidence"):
        evaluate(old, policy=Policy.parse("max-flip-rate = 0.1"))


def test_the_cli_gate_fails_on_too_few_runs_and_passes_on_enough(tmp_path, default_model_dir):
    """Under the mode no token flips, so only the number of runs decides: the two runs of batch size 2
    bound the rate by 66% (fails 0.5, and nothing to bisect); the six of batch sizes 2, 4 and 8 (the
    first and last row of each) by 39% (meets it)."""
    import cli_runner

    (tmp_path / ".git").mkdir()
    base = ["gate", "-n", "4", "--kernels", "batch-invariant", "--require", "max-flip-rate = 0.5"]
    few = cli_runner.run([*base, "-b", "1,2", "--out", "few"], cwd=tmp_path, timeout=300)
    assert few.returncode == 1, few.stdout + few.stderr
    assert "0 of 2 runs diverged" in few.stdout and f"{runs_to_bound(0.5)} runs with no flip would decide" in few.stdout
    assert few.stderr == ""  # no bisect of a condition that did not fail
    enough = cli_runner.run([*base, "-b", "1,2,4,8", "--out", "enough"], cwd=tmp_path, timeout=300)
    assert enough.returncode == 0, enough.stdout + enough.stderr
    assert "policy met (max-flip-rate = 0.5)" in enough.stdout
