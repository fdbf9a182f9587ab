"""An eager Triton launch bound once per call shape: the compiled binary called again directly.

Every eager launch through `kernel[grid](...)` pays Triton's JIT dispatch: binding ~25 arguments,
specialising each, hashing a cache key (27.7 us of host time per TMA matmul on an H200, against
17.5 us for calling the compiled kernel it returned, the same bits; 2026-11-26, gpu_host_profile.py
--parts launch of commit 177235a). A call site that knows everything its launch depends on (shapes,
strides, dtypes, the operands' 16-byte alignment, the device, its own switches and the tuned table)
keys a `BoundLaunch` on that: the first call goes through the JIT and binds the binary it returned
with the launch's fixed arguments, later calls with the same key pass only their tensors.

What the key must hold is the call site's business (triton_matmul._plan_key): anything Triton
specialises on (an integer's value, a pointer's alignment, a dtype) or the call site decides on.
Plans are only made for plain CUDA tensors outside a trace and off the interpreter (`bindable`).
"""

import torch

from nondet.kernels.launch import _plain, interpreting, launch

MAX_PLANS = 4096  # per table: a model has a handful of widths, a probe a handful of prompt lengths


def bindable(t: torch.Tensor) -> bool:
    """Whether a launch on t may be bound: a plain CUDA tensor (no trace, no interpreter)."""
    return t.is_cuda and _plain(t) and not interpreting()


class BoundLaunch:
    """kernel's compiled binary for one key, with every argument after the first `tensors` fixed."""

    __slots__ = ("runner", "tail", "device_index")

    def __init__(self, kernel, compiled, grid: tuple, args: tuple, meta: dict, tensors: int, device_index: int):
        # the binary takes every parameter in signature order, constexprs included, as the JIT passes them
        names = kernel.arg_names
        self.tail = tuple(args[tensors:]) + tuple(meta[name] for name in names[len(args):])
        self.runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
        self.device_index = device_index

    def __call__(self, *tensors) -> None:
        self.runner(*tensors, *self.tail, stream=torch._C._cuda_getCurrentRawStream(self.device_index))


class Plans:
    """A call site's bound launches by key (a bounded dict: emptied when full)."""

    def __init__(self):
        self.table: dict = {}

    def get(self, key):
        return self.table.get(key)

    def add(self, key, plan: BoundLaunch) -> None:
        if len(self.table) >= MAX_PLANS:
            self.table.clear()
        self.table[key] = plan

    def clear(self) -> None:
        self.table.clear()


def launch_keyed(plans: Plans, key, kernel, grid: tuple, like: torch.Tensor, args: tuple, meta: dict,
                 tensors: int) -> None:
    """launch(kernel, grid, like)(*args, **meta), bound under `key` after its first JIT launch; key None
    (not bindable) always takes the JIT. The first `tensors` arguments are the call's tensors; every
    other argument (and the grid) must follow from the key."""
    plan = plans.get(key) if key is not None else None
    if plan is not None:
        plan(*args[:tensors])
        return
    result = launch(kernel, grid, like)(*args, **meta)
    if key is not None and result is not None:
        plans.add(key, BoundLaunch(kernel, result, grid, args, meta, tensors, like.device.index))
