"""How sure a verdict is (nondet/probes/core/confidence.py): the Wilson interval, and the grade.

Positive controls: a run whose tokens differ makes its prompt unstable; a reference margin below the
difference the runs measured makes a prompt fragile although no token flipped; so does an exact tie
(margin 0, as the demo has), even where the runs are bit-identical. Negative: bit-identical runs
without a tie are stable.
"""

import pytest

from nondet.interval import runs_to_bound, wilson
from nondet.probes.core.confidence import FRAGILE, STABLE, UNSTABLE, mode_confidence, prompt_confidence
from nondet.verdict import confidence_line


def step(token, logprob, margin, top=None):
    return {"token": token, "logprob": float(logprob).hex(), "margin": float(margin).hex(),
            "top": [[t, float(lp).hex()] for t, lp in (top or [(token, logprob)])]}


def stream(run_id, steps, reference=False, prompt_id=0):
    return {"run_id": run_id, "is_reference": reference, "prompt_id": prompt_id, "steps": steps}


REF = [step(5, -1.0, 0.5), step(7, -0.7, 0.0), step(9, -0.2, 2.0)]  # step 1: an exact tie
CLEAR = [step(5, -1.0, 0.5), step(7, -0.7, 0.25), step(9, -0.2, 2.0)]  # no tie


def test_wilson_matches_the_closed_forms():
    low, high = wilson(0, 30)
    assert low == 0 and high == pytest.approx(Z2 / (30 + Z2))  # 0 flips: z^2 / (n + z^2), 11.4%
    low, high = wilson(30, 30)
    assert high == 1 and low == pytest.approx(30 / (30 + Z2))
    low, high = wilson(3, 8)
    assert 0.13 < low < 0.14 and 0.69 < high < 0.70  # the textbook values for 3 of 8
    assert wilson(0, 0) == (0.0, 1.0)


Z2 = 1.959963984540054 ** 2


def test_runs_to_bound_is_the_fewest_runs_that_decide():
    n = runs_to_bound(0.01)
    assert wilson(0, n)[1] < 0.01 <= wilson(0, n - 1)[1]


def test_a_token_flip_makes_the_prompt_unstable():
    flipped = REF[:2] + [step(4, -0.3, 1.0)]
    c = prompt_confidence([stream(0, REF, True), stream(1, REF), stream(2, flipped)])
    assert (c["diverged"], c["runs"], c["grade"]) == (1, 2, UNSTABLE)


def test_a_margin_below_the_measured_difference_is_fragile_without_any_flip():
    moved = [step(5, -1.0 + 2 ** -7, 0.5), step(7, -0.7, 0.0), step(9, -0.2, 2.0)]
    c = prompt_confidence([stream(0, REF, True), stream(1, moved)])
    assert c["diverged"] == 0 and c["grade"] == FRAGILE
    assert c["fragile_steps"] == [1] and c["noise"] == 2 ** -7


def test_bit_identical_runs_without_a_tie_are_stable():
    c = prompt_confidence([stream(0, CLEAR, True), stream(1, CLEAR), stream(2, CLEAR)])
    assert (c["diverged"], c["grade"], c["noise"]) == (0, STABLE, 0.0)


def test_an_exact_tie_is_fragile_even_where_the_runs_are_bit_identical():
    c = prompt_confidence([stream(0, REF, True), stream(1, REF), stream(2, REF)])
    assert (c["diverged"], c["grade"], c["noise"], c["fragile_steps"]) == (0, FRAGILE, 0.0, [1])


def test_the_mode_pools_prompts_and_takes_the_worst_grade():
    moved = [step(5, -1.0 + 2 ** -7, 0.5)] + REF[1:]
    streams = [stream(0, CLEAR, True, 0), stream(1, CLEAR, False, 0), stream(2, REF, True, 1),
               stream(3, moved, False, 1)]
    c = mode_confidence(streams)
    assert (c["diverged"], c["runs"], c["grade"]) == (0, 2, FRAGILE)
    assert c["grades"] == {STABLE: 1, FRAGILE: 1} and set(c["prompts"]) == {"0", "1"}


def test_the_line_states_the_bound_or_the_interval_and_the_grade():
    none = mode_confidence([stream(0, CLEAR, True)] + [stream(i, CLEAR) for i in range(1, 31)])
    assert confidence_line("batch-invariant kernels", none) == (
        "batch-invariant kernels: 0 of 30 runs diverged: the flip rate is below 11% at 95%; stable")
    flipped = REF[:2] + [step(4, -0.3, 1.0)]
    some = mode_confidence([stream(0, REF, True), stream(1, flipped), stream(2, REF), stream(3, flipped)])
    assert confidence_line("default kernels", some) == (
        "default kernels: 2 of 3 runs diverged (67%; 95% interval 21%-94%); unstable")
    moved = [step(5, -1.0 + 2 ** -7, 0.5)] + REF[1:]
    fragile = mode_confidence([stream(0, REF, True), stream(1, moved)])
    assert confidence_line("default kernels", fragile).endswith(
        "; fragile (the reference's margin is 0 or below the measured difference at step 1)")
