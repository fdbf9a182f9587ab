"""`nondet kernels bench --score`: the score is a geometric mean of ratios, and 0 when any
kernel failed its bitwise batch-invariance check in the same run (pure functions, no GPU)."""

import math

import pytest

torch = pytest.importorskip("torch")

from nondet.kernels.bench import Check, Report, Row, same_bits, score, score_line  # noqa: E402


def report(rows, checks) -> Report:
    return Report("NVIDIA H200", "2026-11-23 00:00 UTC", "nondet kernels bench --score", "torch", rows, checks)


ROWS = [Row("matmul", "M=1", 2.0, 1.0), Row("matmul", "M=8", 1.0, 2.0),  # ratios 0.5, 2 -> group 1.0
        Row("decode attention", "B=1", 1.0, 0.64)]  # group 0.64


def test_score_is_the_geometric_mean_of_group_means():
    assert score(report(ROWS, [Check("matmul", "K=4 N=4", True)])) == pytest.approx(math.sqrt(1.0 * 0.64))


def test_score_is_zero_when_a_kernel_is_not_invariant():
    checks = [Check("matmul", "K=4 N=4: first m rows", True), Check("rmsnorm", "rows x 4096: first m rows",
                                                                     False, "differs at m = 17")]
    rep = report(ROWS, checks)
    assert score(rep) == 0.0
    assert score_line(rep) == "score=0.000 (not bitwise batch-invariant: rmsnorm rows x 4096)"


def test_score_without_checks_proves_nothing():
    assert score(report(ROWS, [])) == 0.0


def test_same_bits_tells_signed_zeros_apart():
    assert same_bits(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))
    assert not same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not same_bits(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float16))
