"""bound.py: an eager launch bound once per key calls the compiled binary with the arguments in the
kernel's signature order, constexprs included, as Triton's JIT passes them. The GPU side (the same
bits as the JIT launch, a plan per key) is tests/gpu/test_kernels_gpu.py."""

import torch

from nondet.kernels import bound


class FakeKernel:
    arg_names = ["a", "b", "c", "M", "N", "alpha", "BLOCK", "PROGRAMS", "FLAG"]


class FakeCompiled:
    """Records the grid it is indexed with and each call's arguments."""

    def __init__(self):
        self.grids, self.calls = [], []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, stream=None: self.calls.append((args, stream))


def test_a_bound_launch_passes_its_tensors_then_the_fixed_arguments_in_signature_order(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)
    compiled = FakeCompiled()
    args = ("A", "B", "C", 7, 9, 1.0)  # three tensors, then integers and a float
    meta = dict(FLAG=True, BLOCK=64, PROGRAMS=132, num_warps=8, num_stages=3)  # keywords in any order
    plan = bound.BoundLaunch(FakeKernel, compiled, (132,), args, meta, 3, 2)
    assert compiled.grids == [(132, 1, 1)]
    plan("x", "y", "z")
    assert compiled.calls == [(("x", "y", "z", 7, 9, 1.0, 64, 132, True), 1002)]  # num_warps / stages: options, not arguments


def test_plans_are_bounded():
    plans = bound.Plans()
    for i in range(bound.MAX_PLANS):
        plans.add(i, f"plan {i}")
    assert plans.get(0) == "plan 0" and len(plans.table) == bound.MAX_PLANS
    plans.add("one more", "p")
    assert plans.get(0) is None and plans.get("one more") == "p"


def test_a_keyed_launch_goes_through_the_jit_once_per_key_and_never_without_a_key(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    compiled, jit_calls = FakeCompiled(), []

    def jit(kernel, grid, like):
        def call(*args, **meta):
            jit_calls.append(args)
            return compiled
        return call

    monkeypatch.setattr(bound, "launch", jit)
    plans, like = bound.Plans(), torch.empty(2)
    meta = dict(BLOCK=64, PROGRAMS=4, FLAG=False, num_warps=4)
    for tensors in (("A", "B", "C"), ("D", "E", "F")):
        bound.launch_keyed(plans, "key", FakeKernel, (4,), like, (*tensors, 7, 9, 1.0), meta, 3)
    assert jit_calls == [("A", "B", "C", 7, 9, 1.0)]  # the second call took the plan
    assert compiled.calls == [(("D", "E", "F", 7, 9, 1.0, 64, 4, False), 7)]
    bound.launch_keyed(plans, None, FakeKernel, (4,), like, ("G", "H", "I", 7, 9, 1.0), meta, 3)
    assert len(jit_calls) == 2 and len(plans.table) == 1
