"""The one-shot all-reduce's set-up check (kernels/symmetric_sum.py), without processes or a GPU: the
check must accept the gathered sum's bits and nothing else, so a kernel that adds in another order, or
rounds between adds, keeps the all-gather path. tests/gpu/test_symmetric_sum_gpu.py runs the kernel."""

import pytest
import torch

from nondet.kernels import collective, symmetric_sum

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _partials(world, dtype):
    return [symmetric_sum.check_partials(rank, world, "cpu", dtype) for rank in range(world)]


def _fold(parts, dtype):
    """fp32 adds in the order given, cast once: the one-shot's arithmetic in that order."""
    return collective.rank_order_sum(parts).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_check_accepts_the_sum_in_rank_order(dtype):
    for world in (2, 3, 4, 8):
        parts = _partials(world, dtype)
        assert all(torch.isfinite(p).all() for p in parts)
        assert symmetric_sum.agrees_with_rank_order(_fold(parts, dtype), world, "cpu", dtype)
        swapped = _fold([parts[1], parts[0], *parts[2:]], dtype)  # the first add's order never changes a sum
        assert symmetric_sum.agrees_with_rank_order(swapped, world, "cpu", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_positive_control_the_check_rejects_any_other_order_of_three_or_more(dtype):
    for world in (3, 4, 8):
        parts = _partials(world, dtype)
        orders = {"reversed": parts[::-1], "own rank first": parts[1:] + parts[:1],
                  "last two swapped": parts[:-2] + [parts[-1], parts[-2]]}
        for name, order in orders.items():
            assert not symmetric_sum.agrees_with_rank_order(_fold(order, dtype), world, "cpu", dtype), name
        if world == 4:  # ((p0 + p1) + (p2 + p3)): a tree, not a fold
            halves = [parts[0].float() + parts[1].float(), parts[2].float() + parts[3].float()]
            assert not symmetric_sum.agrees_with_rank_order(_fold(halves, dtype), world, "cpu", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_positive_control_the_check_rejects_a_rounding_between_adds(dtype):
    for world in (3, 4):
        parts = _partials(world, dtype)
        coarse = torch.bfloat16 if dtype == torch.float32 else dtype  # a rounding fp32 adds do not make
        stepwise = parts[0]
        for part in parts[1:]:
            stepwise = (stepwise.float() + part.float()).to(coarse).to(dtype)  # rounded after each add
        assert not symmetric_sum.agrees_with_rank_order(stepwise, world, "cpu", dtype)
    rounded_first = _fold([p.bfloat16() for p in _partials(2, torch.float32)], torch.float32)
    assert not symmetric_sum.agrees_with_rank_order(rounded_first, 2, "cpu")  # fp32 partials rounded to bf16


def test_cpu_tensors_never_set_up_the_one_shot():
    # the gloo ranks of the CPU tests: no symmetric memory is tried, the gather path runs, the route says so
    symmetric_sum.prepare(torch.zeros(4), None, original_all_reduce=None)
    assert symmetric_sum.route() is None and symmetric_sum.refused() is None
    assert collective.route() == collective.NAME


@pytest.fixture
def one_rank_group(tmp_path, monkeypatch):
    """A gloo group of one rank, symmetric memory stood in for by plain tensors, the module's state new."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    monkeypatch.setattr(symm_mem, "empty", lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device))
    monkeypatch.setattr(symm_mem, "rendezvous", lambda buffer, group: None)
    monkeypatch.setattr(symmetric_sum, "_STATE", dict(symmetric_sum._STATE, world=0, buffer=None, bf16_buffer=None))
    monkeypatch.setattr(symmetric_sum, "_can_take_part", lambda device: True)  # no GPUs here to ask
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _stand_in_one_shot(add):
    """A one-shot of one rank: the buffer gets the partial, the sum is it (plus `add`, a faulty kernel)."""
    def one_shot(buffer, partial, reduce_op, group):
        buffer.copy_(partial)
        return buffer.clone() + add
    return one_shot


def test_the_set_up_takes_each_dtype_whose_check_passes(one_rank_group, monkeypatch):
    monkeypatch.setattr(torch.ops.symm_mem, "one_shot_all_reduce_copy", _stand_in_one_shot(0))
    assert symmetric_sum._set_up(torch.device("cpu"), one_rank_group.all_reduce) is None
    assert symmetric_sum.route() == symmetric_sum.NAME and symmetric_sum.native_dtypes() == (torch.bfloat16,)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    summed = x.clone()
    symmetric_sum.sum_into(summed)  # one rank: the sum is the partial
    assert torch.equal(summed, x)


def test_positive_control_a_kernel_that_gets_the_sum_wrong_keeps_the_gather_path(one_rank_group, monkeypatch):
    monkeypatch.setattr(torch.ops.symm_mem, "one_shot_all_reduce_copy", _stand_in_one_shot(2.0 ** -30))
    why = symmetric_sum._set_up(torch.device("cpu"), one_rank_group.all_reduce)
    assert "differed from the gathered sum" in why
    assert symmetric_sum.route() is None and symmetric_sum.native_dtypes() == ()


def test_a_rank_that_cannot_take_part_keeps_every_rank_off_the_rendezvous(one_rank_group, monkeypatch):
    monkeypatch.setattr(symmetric_sum, "_can_take_part", lambda device: False)
    monkeypatch.setattr(symmetric_sum, "_checked_buffer", lambda *a: pytest.fail("a rendezvous was entered"))
    why = symmetric_sum._set_up(torch.device("cpu"), one_rank_group.all_reduce)
    assert why.startswith("symmetric memory unavailable on some rank") and symmetric_sum.route() is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_tree_of_two_ranks_is_the_rank_order_sum_and_of_four_is_not(dtype):
    # --tp-invariant's all-reduce takes the one-shot at two ranks only: there its one node is the gathered sum
    from nondet.kernels.rounded_tree import pairwise_tree

    two = _partials(2, dtype)
    assert collective.tree_is_rank_order(2)
    assert torch.equal(pairwise_tree(two), _fold(two, dtype))
    four = _partials(4, dtype)  # the positive control: at four ranks the tree rounds between adds
    assert not collective.tree_is_rank_order(4)
    assert not torch.equal(pairwise_tree(four), _fold(four, dtype))


def test_under_the_tree_two_ranks_take_the_one_shot_and_four_the_tree(monkeypatch):
    import torch.distributed as dist

    taken = []
    monkeypatch.setattr(collective, "prepare_one_shot", lambda *a: None)
    monkeypatch.setattr(collective, "one_shot_takes", lambda tensor, group: True)
    monkeypatch.setattr(collective, "one_shot_sum_into", lambda tensor: taken.append("one-shot"))
    monkeypatch.setattr(collective, "gather", lambda tensor, group: taken.append("tree") or [tensor] * 4)
    for world, route in ((2, "one-shot"), (4, "tree")):
        monkeypatch.setattr(dist, "get_world_size", lambda group=None, w=world: w)
        with collective.tree_order():
            collective.invariant_all_reduce(torch.ones(2, 4))
        assert taken.pop() == route, world
