"""How the Triton kernels are launched, so that torch.compile can look through the launch.

Every kernel is launched as `launch(kernel, grid)(*args, **meta)`: outside a trace that is
`kernel[grid](...)`, the ordinary JIT launch. Inside a `torch.library.triton_op` being traced
(custom_ops.py registers the GPU ops that way) the launch becomes a node of Inductor's graph, and
Inductor calls the kernel from its generated code with its own launcher instead of a Python call
into our op per launch (the compiled mode's 512-token prefill spent ~190 ms of host time for
~20 ms of GPU work through Python-level custom ops; docs/benchmarks.md).

A traced body sees fake tensors, which have no address: `aligned16` reads alignment from the
storage offset there (fresh allocations, the caching allocator's and Inductor's, are aligned).

Eager launches skip Triton's binder after the first call of a kind (`_FastLaunch`): Triton's
`kernel[grid](...)` spends 19 us of host time on an empty 2-argument kernel and ~60 us on the TMA
matmul's 25 arguments (H100, triton 3.6), which made the mode's eager 512-token prefill of an
8B-shaped model host-bound (0.50x of default). The binary Triton picked is kept under a key that
refines Triton's own specialization (each tensor's dtype and 16-byte alignment, each integer's
== 1 / % 16 / 32-bit range, every constexpr's value, the launch options, the device), and later
calls with the same key launch it directly (`CompiledKernel[grid](*args)`, Triton's own runner).
"""

import functools
import os

import torch


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (kernels run on the CPU, in numpy)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


FAST_LAUNCH = True  # False: every eager launch through Triton's JIT (benchmarks, tests)


def launch(kernel, grid, like: torch.Tensor):
    """kernel[grid]; inside a triton_op being traced (`like`, a tensor of the call, is fake), the
    traceable wrap_triton(kernel)[grid]. Building that wrapper costs ~40 us, so eager calls skip it."""
    if not _plain(like):
        return torch.library.wrap_triton(kernel)[grid]
    if FAST_LAUNCH and like.is_cuda and not interpreting():
        return _fast_launcher(kernel).bind(grid)
    return kernel[grid]


@functools.lru_cache(maxsize=None)
def _fast_launcher(kernel) -> "_FastLaunch":
    return _FastLaunch(kernel)


class _FastLaunch:
    """One Triton kernel's eager launches: Triton's JIT the first time per key, its binary after."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = list(kernel.arg_names)  # every parameter, constexprs included, in order
        self.constexpr = frozenset(kernel.constexprs)  # their positions
        self.binaries = {}  # key -> triton CompiledKernel
        self.usable = True  # False once this Triton's objects did not look as expected

    def bind(self, grid):
        return functools.partial(self.run, grid)

    def run(self, grid, *args, **meta):
        key = self._key(args, meta) if self.usable else None
        binary = self.binaries.get(key) if key is not None else None
        if binary is None:
            binary = self.kernel[grid](*args, **meta)
            if key is not None:
                self._keep(key, binary)
            return binary
        values = (*args, *(meta[name] for name in self.names[len(args):]))
        stream = torch._C._cuda_getCurrentRawStream(key[0])  # what Triton's own launch asks its driver for
        binary[(*grid, 1, 1)[:3]](*values, stream=stream)
        return binary

    def _keep(self, key, binary) -> None:
        if hasattr(binary, "function") and hasattr(binary, "packed_metadata") and callable(getattr(binary, "__getitem__", None)):
            self.binaries[key] = binary
        else:  # another Triton's launch API: stay on the JIT
            self.usable = False

    def _key(self, args, meta):
        """A key that refines Triton's specialization of this call, or None (launch through the JIT)."""
        names = self.names
        if len(args) + sum(1 for name in names[len(args):] if name in meta) != len(names):
            return None  # a parameter left to its default: let the JIT bind it
        from triton import knobs

        if knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None:
            return None  # a profiler's hooks want launch metadata: the JIT's path provides it
        parts = [torch.cuda.current_device()]
        for i, value in enumerate((*args, *(meta[name] for name in names[len(args):]))):
            part = value if i in self.constexpr else _specialization(value)
            if part is _UNKNOWN:
                return None
            parts.append(part)
        parts.extend(sorted((k, v) for k, v in meta.items() if k not in names))  # num_warps, num_stages
        key = tuple(parts)
        try:
            hash(key)
        except TypeError:
            return None
        return key


def _specialization(value):
    """What Triton may specialize a runtime argument on (a superset of it)."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return "b", value
    if isinstance(value, int):
        return "i", value == 1, value % 16 == 0, -2**31 <= value < 2**31, 0 <= value < 2**32
    if isinstance(value, float):
        return "f"
    if value is None:
        return None
    return _UNKNOWN  # a host TMA descriptor, ...: the JIT decides


_UNKNOWN = object()


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
