"""The CPU path: with the mode on, every row of a matmul, norm, softmax or attention is bitwise the
same whatever the batch around it.

Each invariance check has its control on the same case (tests/controls.py): the default kernels
differ there. fp32 matmuls differ on common CPUs by themselves (torch 2.13's MKL path picks its
algorithm by M), and so does an fp32 row mean over a row wider than torch's grain size (alone it
is split over the threads); bf16 matmuls, norms and softmax of model widths do not, so those run
over controls.row_count_kernels(), whose reductions depend on the number of rows in the call, and
the mode has to replace them on the same dispatch key.
"""

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from controls import mode, require_row0_variance, require_variance, row0_differs, row_count_kernels

from nondet.kernels import hf, reference

DTYPES = (torch.float32, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
MATMUL_CASES = ("linear", "linear_bias", "linear_3d", "mm", "addmm", "bmm")
ROW_CASES = ("mean_sq", "rms_norm", "layer_norm", "softmax", "log_softmax")
SIZES = (2, 3, 7, 16, 17, 31, 32)  # row 0 among m rows: around the CPU path's 16-row blocks, and a few more


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def matmul_variance(dtype):
    """Where a matmul case's variance comes from: the host's fp32 GEMM, or row_count_kernels (the
    host's bf16 GEMM is invariant in M on AVX512 Xeons)."""
    return contextlib.nullcontext() if dtype == torch.float32 else row_count_kernels()


def matmul_case(name, dtype):
    """(fn, x): the row under test is row 0 of fn(x[:m])."""
    torch.manual_seed(1)
    x, x3 = torch.randn(32, 256, dtype=dtype), torch.randn(32, 5, 256, dtype=dtype)
    w, bias = torch.randn(384, 256, dtype=dtype), torch.randn(384, dtype=dtype)
    heads = torch.randn(2, 256, 40, dtype=dtype)
    return {
        "linear": (lambda t: F.linear(t, w), x),
        "linear_bias": (lambda t: F.linear(t, w, bias), x),
        "linear_3d": (lambda t: F.linear(t, w), x3),  # rows are (batch, seq)
        "mm": (lambda t: torch.mm(t, w.t()), x),
        "addmm": (lambda t: torch.addmm(bias, t, w.t()), x),
        # (heads, rows, K) @ (heads, K, 40): the rows of each batch entry, as attention's queries
        "bmm": (lambda t: torch.bmm(t.transpose(0, 1), heads).transpose(0, 1), x3[:, :2]),
    }[name]


def row_case(name, dtype):
    """(fn, x) of a norm or softmax over rows of 512 (x: 32 x 7 rows)."""
    torch.manual_seed(2)
    x, w = torch.randn(32, 7, 512, dtype=dtype), torch.randn(512, dtype=dtype)
    return {
        "mean_sq": (lambda t: t.float().pow(2).mean(-1, keepdim=True), x),  # HF RMSNorm
        "rms_norm": (lambda t: F.rms_norm(t, (512,), w), x),
        "layer_norm": (lambda t: F.layer_norm(t, (512,), w, w), x),
        "softmax": (lambda t: torch.softmax(t, -1), x),
        "log_softmax": (lambda t: torch.log_softmax(t.float(), -1), x),
    }[name]


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_blocks_every_row_equals_the_row_alone(dtype):
    # the premise of the CPU path (cpu.mm / cpu.addmm, the mode's matmul): inside a fixed-shape call
    # a row's bits do not depend on where in the block it sits or on the other rows
    torch.manual_seed(0)
    x, w, bias = torch.randn(64, 96, dtype=dtype), torch.randn(200, 96, dtype=dtype), torch.randn(200, dtype=dtype)
    mm, addmm = (lambda t: torch.mm(t, w.t())), (lambda t: torch.addmm(bias, t, w.t()))
    with matmul_variance(dtype):
        for fn in (mm, addmm):
            alone = torch.cat([fn(x[i:i + 1]) for i in range(64)])
            require_variance(alone, fn(x), f"{dtype} mm / addmm, each of 64 rows alone vs in the block")
            with mode(ops={"matmul"}):
                full = fn(x)
                assert [i for i in range(64) if not torch.equal(fn(x[i:i + 1])[0], full[i])] == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MATMUL_CASES)
def test_matmul_row0_invariant_with_mode(case, dtype):
    fn, x = matmul_case(case, dtype)
    with matmul_variance(dtype):
        require_row0_variance(fn, x, f"{case} {dtype}, row 0 alone vs among {x.shape[0]}")
        with mode(ops={"matmul"}):
            assert row0_differs(fn, x, SIZES) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_with_mode_matches_reference(dtype):
    torch.manual_seed(1)
    x, w, bias = torch.randn(32, 256, dtype=dtype), torch.randn(384, 256, dtype=dtype), torch.randn(384, dtype=dtype)
    with mode(ops={"matmul"}):
        assert rel(F.linear(x, w, bias), reference.mm(x, w.t(), bias)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ROW_CASES)
def test_norm_and_softmax_row0_invariant_with_mode(case, dtype):
    # the host's row reductions at width 512 are invariant: the variance is row_count_kernels'
    fn, x = row_case(case, dtype)
    with row_count_kernels():
        require_row0_variance(fn, x, f"{case} {dtype} under row_count_kernels")
        with mode(ops={"norm", "softmax"}):
            assert row0_differs(fn, x, SIZES) == []


def test_wide_row_mean_invariant_with_mode():
    # the host's own variance in a norm: a row wider than torch's grain size (32768) is split over the
    # threads when it is the only row of the call, and summed whole when there are several
    x = torch.randn(4, 33000, generator=torch.Generator().manual_seed(2))
    fn = lambda t: t.pow(2).mean(-1, keepdim=True)  # noqa: E731 (HF RMSNorm's mean, fp32)
    require_row0_variance(fn, x, "an fp32 row mean of width 33000, alone vs among 4 rows")
    with mode(ops={"norm"}):
        assert row0_differs(fn, x, range(2, 5)) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_and_softmax_with_mode_match_reference(dtype):
    torch.manual_seed(2)
    x, w = torch.randn(32, 7, 512, dtype=dtype), torch.randn(512, dtype=dtype)
    with mode(ops={"norm", "softmax"}):
        assert rel(x.float().pow(2).mean(-1), reference.mean_last(x.float().pow(2))) < 1e-6
        assert rel(F.layer_norm(x, (512,), w, w), reference.layer_norm(x, w, w, 1e-5)) < TOL[dtype]
        assert rel(torch.log_softmax(x.float(), -1), reference.softmax(x, log=True)) < 1e-6
        # reductions over other dims go to the original kernels, still correct
        assert rel(x.float().mean(0), x.double().mean(0)) < 1e-6


# attention: the function a model's layers call once the mode selected it (hf.py); outside the
# mode's attention class it runs transformers' SDPA, which is the control
LAYER = SimpleNamespace(is_causal=True, num_key_value_groups=2, training=False)


def attend(q, k, v, mask):
    """(B, H, Q, D) attention with scale 0.25 -> (B, Q, H, D)."""
    return hf.attention_forward(LAYER, q, k, v, mask, scaling=0.25)[0]


def causal(q_len, s):
    """Query i sees KV positions up to S - Q + i (bottom-right), as a bool mask."""
    return torch.ones(1, 1, q_len, s, dtype=torch.bool).tril(s - q_len)


def attention_case():
    torch.manual_seed(3)
    return torch.randn(4, 4, 9, 16), torch.randn(4, 2, 30, 16), torch.randn(4, 2, 30, 16)


def test_cpu_attention_with_mode_matches_reference():
    q, k, v = attention_case()
    with mode(ops="attention"):
        assert rel(attend(q, k, v, causal(9, 30)), reference.attention(q, k, v, scale=0.25)) < 1e-5


def test_cpu_attention_row_alone_equals_the_row_in_a_batch():
    q, k, v = attention_case()
    require_variance(attend(q[:1], k[:1], v[:1], causal(9, 30))[0], attend(q, k, v, causal(9, 30))[0],
                     "SDPA, row 0 alone vs among 4 (no padding)")
    with mode(ops="attention"):
        assert torch.equal(attend(q, k, v, causal(9, 30))[0], attend(q[:1], k[:1], v[:1], causal(9, 30))[0])


def test_cpu_attention_left_padded_row_equals_the_row_alone():
    # row 1 carries 5 padding positions in front of the request of row 0 alone, among longer rows
    q, k, v = attention_case()
    solo = (q[:1], k[:1], v[:1], causal(9, 30))
    kp = torch.cat([torch.randn(3, 2, 5, 16), torch.cat([k[1:2], k[:1], k[2:3]])], dim=2)
    vp = torch.cat([torch.randn(3, 2, 5, 16), torch.cat([v[1:2], v[:1], v[2:3]])], dim=2)
    qp = torch.cat([torch.randn(3, 4, 5, 16), torch.cat([q[1:2], q[:1], q[2:3]])], dim=2)
    mask = causal(14, 35).repeat(3, 1, 1, 1)
    mask[1, ..., :5] = False
    require_variance(attend(*solo)[0], attend(qp, kp, vp, mask)[1, 5:], "SDPA, a row alone vs left-padded among 3")
    with mode(ops="attention"):
        assert torch.equal(attend(qp, kp, vp, mask)[1, 5:], attend(*solo)[0])
