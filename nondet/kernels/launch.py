"""How the Triton kernels are launched, so that torch.compile can look through the launch.

Every kernel is launched as `launch(kernel, grid)(*args, **meta)`: outside a trace that is
`kernel[grid](...)`, the ordinary JIT launch. Inside a `torch.library.triton_op` being traced
(custom_ops.py registers the GPU ops that way) the launch becomes a node of Inductor's graph, and
Inductor calls the kernel from its generated code with its own launcher instead of a Python call
into our op per launch (the compiled mode's 512-token prefill spent ~190 ms of host time for
~20 ms of GPU work through Python-level custom ops; docs/benchmarks.md).

A traced body sees fake tensors, which have no address: `aligned16` reads alignment from the
storage offset there (fresh allocations, the caching allocator's and Inductor's, are aligned).
"""

import functools
import os

import torch


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (kernels run on the CPU, in numpy)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def launch(kernel, grid, like: torch.Tensor):
    """kernel[grid]; inside a triton_op being traced (`like`, a tensor of the call, is fake), the
    traceable wrap_triton(kernel)[grid]. Building that wrapper costs ~40 us, so eager calls skip it."""
    if _plain(like):
        return kernel[grid]
    return torch.library.wrap_triton(kernel)[grid]


def aligned16(t: torch.Tensor) -> bool:
    """Whether t's first element sits on a 16-byte boundary (Triton specializes binaries on it)."""
    if _plain(t):
        return t.data_ptr() % 16 == 0
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(t):
        return (t.storage_offset() * t.element_size()) % 16 == 0
    return t.data_ptr() % 16 == 0


def _plain(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


class triton_scratch:  # noqa: N801 - used as a context manager, like contextlib's
    """Global memory for Triton kernels that build TMA descriptors in the kernel (the TMA matmul:
    triton_matmul._device_desc), for this body only. Inductor hands them scratch itself; a launch
    from Python (eager, or a graph run by aot_eager) asks Triton's allocator, by default one that
    refuses. Triton keeps the allocator in a ContextVar: set here, reset on exit, so nothing
    process-wide changes. A class, not a generator: it wraps every eager matmul launch (~1 us)."""

    def __enter__(self):
        allocator = _allocator_var()
        self._reset = None if allocator is None else (allocator, allocator.set(_scratch))
        return self

    def __exit__(self, *exc):
        if self._reset is not None:
            allocator, token = self._reset
            allocator.reset(token)
        return False


@functools.lru_cache(maxsize=None)
def _allocator_var():
    """Triton's allocator ContextVar, or None without Triton (nothing launches a Triton kernel then)."""
    try:
        from triton.runtime import _allocation
    except ImportError:
        return None
    return _allocation._allocator


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")  # the caching allocator aligns to 512 bytes
