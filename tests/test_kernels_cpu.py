"""The CPU path: with the mode on, every row of a matmul, norm or softmax is bitwise the same
whatever the batch around it (torch 2.13's MKL path is batch-variant without it)."""

import pytest
import torch
import torch.nn.functional as F

from nondet.kernels import batch_invariant, cpu, reference

DTYPES = (torch.float32, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def row0_equal(fn, x, ms=range(1, 33)):
    """fn(x[:m])[0] is bitwise equal to fn(x[:1])[0] for every m."""
    row0 = fn(x[:1])[0]
    return [m for m in ms if not torch.equal(fn(x[:m])[0], row0)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_blocks_every_row_equals_the_row_alone(dtype):
    # the premise of the CPU path: inside a fixed-shape call a row's bits do not depend on
    # where in the block it sits or on the other rows
    torch.manual_seed(0)
    x = torch.randn(64, 96, dtype=dtype)
    w = torch.randn(200, 96, dtype=dtype)
    bias = torch.randn(200, dtype=dtype)
    full_mm, full_addmm = cpu.mm(x, w.t()), cpu.addmm(bias, x, w.t())
    for i in range(64):
        assert torch.equal(cpu.mm(x[i:i + 1], w.t())[0], full_mm[i]), i
        assert torch.equal(cpu.addmm(bias, x[i:i + 1], w.t())[0], full_addmm[i]), i


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_ops_row0_invariant_with_mode(dtype):
    torch.manual_seed(1)
    x = torch.randn(32, 256, dtype=dtype)
    w = torch.randn(384, 256, dtype=dtype)
    bias = torch.randn(384, dtype=dtype)
    x3 = torch.randn(32, 5, 256, dtype=dtype)
    with batch_invariant(ops={"matmul"}):
        assert row0_equal(lambda t: F.linear(t, w), x) == []
        assert row0_equal(lambda t: F.linear(t, w, bias), x) == []
        assert row0_equal(lambda t: F.linear(t, w), x3) == []  # 3-D input: rows are (batch, seq)
        assert row0_equal(lambda t: torch.mm(t, w.t()), x) == []
        assert row0_equal(lambda t: torch.addmm(bias, t, w.t()), x) == []
        assert row0_equal(lambda t: torch.bmm(t, x3[0].t().expand(t.shape[0], 256, 5)), x3) == []
        assert rel(F.linear(x, w, bias), reference.mm(x, w.t(), bias)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_and_softmax_row0_invariant_with_mode(dtype):
    torch.manual_seed(2)
    x = torch.randn(32, 7, 512, dtype=dtype)
    w = torch.randn(512, dtype=dtype)
    with batch_invariant(ops={"norm", "softmax"}):
        assert row0_equal(lambda t: t.float().pow(2).mean(-1, keepdim=True), x) == []  # HF RMSNorm
        assert row0_equal(lambda t: F.rms_norm(t, (512,), w), x) == []
        assert row0_equal(lambda t: F.layer_norm(t, (512,), w, w), x) == []
        assert row0_equal(lambda t: torch.softmax(t, -1), x) == []
        assert row0_equal(lambda t: torch.log_softmax(t.float(), -1), x) == []
        assert rel(x.float().pow(2).mean(-1), reference.mean_last(x.float().pow(2))) < 1e-6
        assert rel(F.layer_norm(x, (512,), w, w), reference.layer_norm(x, w, w, 1e-5)) < TOL[dtype]
        assert rel(torch.log_softmax(x.float(), -1), reference.softmax(x, log=True)) < 1e-6
        # reductions over other dims go to the original kernels, still correct
        assert rel(x.float().mean(0), x.double().mean(0)) < 1e-6


def test_cpu_attention_matches_reference_and_is_row_invariant():
    torch.manual_seed(3)
    q = torch.randn(4, 4, 9, 16)
    k = torch.randn(4, 2, 30, 16)
    v = torch.randn(4, 2, 30, 16)
    out = cpu.attention(q, k, v, None, 0.25, [0, 0, 0, 0])
    assert rel(out, reference.attention(q, k, v, scale=0.25)) < 1e-5
    solo = cpu.attention(q[:1], k[:1], v[:1], None, 0.25, [0])
    assert torch.equal(out[0], solo[0])
    # left padding: row 1 carries 5 padding positions in front of the same request
    kp = torch.cat([torch.randn(1, 2, 5, 16), k[:1]], dim=2)
    vp = torch.cat([torch.randn(1, 2, 5, 16), v[:1]], dim=2)
    qp = torch.cat([torch.randn(1, 4, 5, 16), q[:1]], dim=2)
    mask = torch.ones(1, 1, 14, 35, dtype=torch.bool).tril(35 - 14)
    mask[..., :5] = False
    padded = cpu.attention(qp, kp, vp, mask, 0.25, [5])
    assert torch.equal(padded[0, 5:], solo[0])
