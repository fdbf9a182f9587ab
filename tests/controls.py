"""Controls for the invariance tests: a test of the fix is evidence only where the default kernels
differ on its case, on this host.

Each invariance test first computes its case with the default kernels and calls
require_variance: either the control fires (the default's bits differ, and the test goes on to
check the mode on the same case) or the host's default is invariant there, and the test is
skipped with the reason (conftest.py counts these skips in the summary). Where no host kernel
varies (softmax, layer norm and bf16 matmuls on common CPUs) row_count_kernels() builds the
variance: it replaces the reductions on the CPU dispatch key, where the mode's own kernels
replace them, with ones whose summation order depends on the number of rows in the call.

NONDET_TEST_WITHOUT_MODE=1 makes mode() a no-op and FIX_KERNELS the default kernels: every
invariance test must then fail or skip (the check that these tests can fail).
"""

import contextlib
import functools
import operator
import os
import warnings

import pytest
import torch

from nondet.kernels import batch_invariant

WITHOUT_MODE = os.environ.get("NONDET_TEST_WITHOUT_MODE") == "1"
FIX_KERNELS = "default" if WITHOUT_MODE else "batch-invariant"  # the probe's kernels mode under test
SKIP_PREFIX = "control did not fire: "  # conftest.py finds the control-skips by this prefix
aten = torch.ops.aten
MAX_SPLIT = 8  # row_count_kernels: partial sums of a call with R rows (min(R, MAX_SPLIT))


def mode(*args, **kwargs):
    """batch_invariant(*args, **kwargs), or a no-op under NONDET_TEST_WITHOUT_MODE=1."""
    return contextlib.nullcontext() if WITHOUT_MODE else batch_invariant(*args, **kwargs)


def same(a, b) -> bool:
    """Bitwise equal: tensors by torch.equal, sequences and dicts item by item, the rest by ==."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def require_variance(alone, batched, what: str) -> None:
    """The control: the default kernels give the two sides of the case (a row alone and in a batch,
    a static and a dynamic cache, ...) different bits; what names the case in the skip reason.
    Where they do not, skip: on this host the test would pass without the fix."""
    if same(alone, batched):
        pytest.skip(f"{SKIP_PREFIX}the default kernels are invariant on {what}")


def require_divergence(summary: dict, what: str) -> None:
    """require_variance for a probe: the default kernels' summary has a numeric divergence."""
    if summary["first_numeric_divergence"] is None:
        pytest.skip(f"{SKIP_PREFIX}the default kernels are invariant on {what}")


def row0(fn, x, m: int) -> torch.Tensor:
    """Row 0 of fn over the first m rows of x."""
    return fn(x[:m])[0]


def row0_differs(fn, x, ms) -> list[int]:
    """The m in ms where fn's row 0 over x[:m] is not bitwise its row 0 over x[:1]."""
    alone = row0(fn, x, 1)
    return [m for m in ms if not same(row0(fn, x, m), alone)]


def require_row0_variance(fn, x, what: str) -> None:
    """The control of a row-0 test: fn's row 0 alone and in the full batch x differ."""
    require_variance(row0(fn, x, 1), row0(fn, x, x.shape[0]), what)


# row_count_kernels: reductions whose order depends on the number of rows R of the call. Their own
# sums and products go through .out overloads the mode never overrides (nondet/kernels/overrides.py)
# and row_count_kernels leaves alone: no recursion into either.

def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def _in_order(parts) -> torch.Tensor:
    """Partial sums, each rounded to bf16, added in order in fp32."""
    return functools.reduce(operator.add, [p.bfloat16().float() for p in parts])


def _row_sum(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x.sum(-1, keepdim=True) in fp32 as min(rows, MAX_SPLIT) partial sums: the order a library that
    splits a row's reduction by the call's shape takes."""
    chunks = x.float().chunk(min(rows, MAX_SPLIT), -1)
    return _in_order(aten.sum.IntList_out(c, [-1], True, out=torch.empty(0)) for c in chunks)


def _mm(a, b):
    """(M, K) @ (K, N), K split into min(M, MAX_SPLIT) partial products."""
    n = min(a.shape[0], MAX_SPLIT)
    zeros = torch.zeros(1, a.shape[0], b.shape[1])
    parts = (aten.baddbmm.out(zeros, ac[None], bc[None], beta=0, out=torch.empty(0))[0]
             for ac, bc in zip(a.float().chunk(n, 1), b.float().chunk(n, 0)))
    return _in_order(parts).to(a.dtype)


def _mean(x, dim, keepdim=False, *, dtype=None):
    assert len(dim) == 1 and dim[0] % x.dim() == x.dim() - 1, "row_count_kernels: last-dim means only"
    x = x if dtype is None else x.to(dtype)
    out = (_row_sum(x, _rows(x)) / x.shape[-1]).to(x.dtype)
    return out if keepdim else out.squeeze(-1)


def _softmax(x, dim, half_to_float, log=False):
    xf = x.float()
    shifted = xf - xf.amax(-1, keepdim=True)
    total = _row_sum(shifted.exp(), _rows(x))
    out = shifted - total.log() if log else shifted.exp() / total
    return out.to(torch.float32 if half_to_float else x.dtype)


def _layer_norm(x, normalized_shape, weight, bias, eps):  # from the row-count mean (mean.dim below)
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    centered = xf - mean
    rstd = torch.rsqrt((centered * centered).mean(-1, keepdim=True) + eps)
    y = centered * rstd * weight.float() + bias.float()
    return y.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def _out(fn):
    """The .out overload of a functional control kernel."""
    def kernel(*args, out, **kwargs):
        result = fn(*args, **kwargs)
        return out.resize_(result.shape).copy_(result)
    return kernel


def _addmm(bias, a, b, *, beta=1, alpha=1):
    return beta * bias + alpha * _mm(a, b)


def _bmm(a, b):
    return torch.stack([_mm(a[i], b[i]) for i in range(a.shape[0])])


_KERNELS = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "mean.dim": _mean, "native_layer_norm": _layer_norm,
            "_softmax": _softmax, "_log_softmax": functools.partial(_softmax, log=True)}
_OUT_KERNELS = {"mm.out": _mm, "addmm.out": _addmm, "bmm.out": _bmm, "mean.out": _mean,
                "_softmax.out": _softmax, "_log_softmax.out": functools.partial(_softmax, log=True)}


@contextlib.contextmanager
def row_count_kernels():
    """Matmuls, row means, softmax and layer norm on the CPU key (functional and .out overloads) whose
    bits depend on the number of rows in the call: a row alone (R = 1) and the same row among others
    differ on every host. The mode's kernels replace them on the same key, and call the .out overloads
    only on fixed-size row blocks, so they must come out invariant."""
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "overriding a previously registered kernel"
            for name, kernel in _KERNELS.items():
                library.impl(name, kernel, "CPU")
            for name, kernel in _OUT_KERNELS.items():
                library.impl(name, _out(kernel), "CPU")
        yield
    finally:
        library._destroy()


def control_skips(skipped_reports) -> list[tuple[str, str]]:
    """(test id, reason) of each report skipped by require_variance / require_divergence."""
    found = []
    for report in skipped_reports:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if SKIP_PREFIX in reason:
            found.append((report.nodeid, reason.split(SKIP_PREFIX, 1)[1]))
    return found
