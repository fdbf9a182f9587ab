"""The one-shot all-reduce's set-up check (kernels/symmetric_sum.py), without processes or a GPU: the
check must accept the gathered sum's bits and nothing else, so a kernel that adds in another order, or
rounds between adds, keeps the all-gather path. tests/gpu/test_symmetric_sum_gpu.py runs the kernel."""

import torch

from nondet.kernels import collective, symmetric_sum


def _partials(world):
    return [symmetric_sum.check_partials(rank, world, "cpu") for rank in range(world)]


def test_the_check_accepts_the_sum_in_rank_order_in_fp32():
    for world in (2, 3, 4, 8):
        assert symmetric_sum.agrees_with_rank_order(collective.rank_order_sum(_partials(world)), world, "cpu")


def test_positive_control_the_check_rejects_any_other_order_of_three_or_more():
    for world in (3, 4, 8):
        parts = _partials(world)
        reversed_order = collective.rank_order_sum(parts[::-1])
        last_first = parts[0] + collective.rank_order_sum(parts[1:])  # p0 + ((p1 + p2) + ...)
        rotated = collective.rank_order_sum(parts[1:] + parts[:1])  # each rank starting from its own partial
        for wrong in (reversed_order, last_first, rotated):
            assert not torch.equal(wrong, collective.rank_order_sum(parts))  # the orders differ on these values
            assert not symmetric_sum.agrees_with_rank_order(wrong, world, "cpu")


def test_positive_control_the_check_rejects_a_rounding_between_adds():
    for world in (2, 3):
        parts = _partials(world)
        in_bf16 = collective.rank_order_sum([p.bfloat16() for p in parts])  # bf16 inputs: a rounding before the sum
        assert not symmetric_sum.agrees_with_rank_order(in_bf16, world, "cpu")
        stepwise = parts[0]
        for part in parts[1:]:
            stepwise = (stepwise + part).bfloat16().float()  # a rounding after each add
        assert not symmetric_sum.agrees_with_rank_order(stepwise, world, "cpu")


def test_cpu_tensors_never_set_up_the_one_shot():
    # the gloo ranks of the CPU tests: no symmetric memory is tried, the gather path runs, the route says so
    symmetric_sum.prepare(torch.zeros(4), None, original_all_reduce=None)
    assert symmetric_sum.route() is None and symmetric_sum.refused() is None
    assert collective.route() == collective.NAME
