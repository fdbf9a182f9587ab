"""The K tree's node (custom_ops.rounded_add): one torch.add for 16-bit floats must give the bits of an
fp32 add rounded once, the arithmetic every TP degree's tree and the two-rank one-shot share.

The data holds sums that round (most of them), exact ties both ways, overflow to inf, subnormals, signed
zeros and NaNs (compared as NaN, not by payload). The control: the same sums truncated instead of rounded to nearest even differ, so a node
that rounded another way would fail here. Checked also under ATEN_CPU_CAPABILITY=default (no vector path).
"""

import os
import subprocess
import sys

import pytest
import torch

from nondet.kernels import custom_ops

DTYPES = (torch.bfloat16, torch.float16)


def _cases(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    n = 1 << 16
    spread = torch.exp(torch.randn(n, generator=gen) * 6)  # magnitudes from subnormal to overflow
    a = torch.randn(n, generator=gen) * spread
    b = torch.randn(n, generator=gen) * spread.flip(0)
    ulp_half = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)  # half an ulp of 1.0
    ties = torch.tensor([1.0 + 2 * ulp_half, 1.0, -1.0 - 2 * ulp_half, 0.0, -0.0, float("inf"), float("nan"), 1e-40])
    tie_b = torch.tensor([ulp_half, ulp_half, -ulp_half, -0.0, -0.0, float("-inf"), 1.0, 1e-40])
    return torch.cat([a, ties]).to(dtype), torch.cat([b, tie_b]).to(dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x's bit patterns, every NaN as one pattern (torch.add gives the canonical NaN, the fp32 formula's
    cast may keep a sign or payload: both NaN, no token can tell them apart)."""
    return torch.where(torch.isnan(x), torch.full_like(x, float("nan")), x).view(torch.int16)


def _reference(a, b):
    return (a.float() + b.float()).to(a.dtype)


def _truncated(a, b):
    """The fp32 sum with its low bits dropped (round toward zero): what the control rounds with."""
    total = (a.float() + b.float()).view(torch.int32)
    keep = 16 if a.dtype == torch.bfloat16 else 13
    return (total & ~((1 << keep) - 1)).view(torch.float32).to(a.dtype)  # exact for bf16; fp16 near it


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_add_has_the_bits_of_an_fp32_add_rounded_once_and_the_control_fires(dtype):
    a, b = _cases(dtype)
    node = custom_ops.rounded_add(a, b)
    assert torch.equal(_bits(node), _bits(_reference(a, b)))
    rounded = (node.float() != a.float() + b.float()) & torch.isfinite(node)
    assert rounded.sum() > len(a) // 2  # most sums are not representable: the rounding is exercised
    assert not torch.equal(_bits(node), _bits(_truncated(a, b)))  # control: another rounding is caught
    assert node[-8:-6].tolist() == [1.0 + 4 * 2.0 ** (-8 if dtype == torch.bfloat16 else -11), 1.0]  # ties to even


def test_other_dtypes_keep_the_fp32_formula():
    a = torch.tensor([1.0 + 2.0 ** -40], dtype=torch.float64)
    assert custom_ops.rounded_add(a, a).item() == 2.0  # fp64 added in fp32, as before: the low bits dropped


def test_the_node_keeps_its_bits_without_the_cpus_vector_path():
    code = ("import torch, sys; sys.path.insert(0, 'tests'); import test_rounded_tree as t;"
            "from nondet.kernels import custom_ops;"
            "[sys.exit(1) for d in t.DTYPES for a, b in [t._cases(d)]"
            " if not torch.equal(t._bits(custom_ops.rounded_add(a, b)), t._bits(t._reference(a, b)))]")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
