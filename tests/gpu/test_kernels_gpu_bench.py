"""GPU regressions: the illegal memory access of `nondet kernels bench` in
one process, and the M-bucketed matmul giving every row the same bits at every M."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from nondet.kernels import bench, triton_attention, triton_matmul  # noqa: E402


@pytest.mark.parametrize("b,s", [(1, 32768), (32, 32768), (64, 4096)])
def test_decode_kv_start_from_a_recycled_block_stays_inside_the_cache(b, s):
    # The failing case: do_bench_cudagraph's side stream launched the decode kernel before
    # torch.zeros had written kv_start, so the kernel read a recycled block's bits (negative
    # ints) and addressed outside K/V. Out-of-range starts are now clamped on the device.
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 8, s, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    zero = triton_attention.attention(q, k, v, None, None, torch.zeros(b, dtype=torch.int32, device="cuda"))
    garbage = torch.full((b,), -(1 << 30), dtype=torch.int32, device="cuda")
    garbage[1::2] = (1 << 31) - 1
    out = triton_attention.attention(q, k, v, None, None, garbage)
    torch.cuda.synchronize()
    assert torch.equal(out[0::2], zero[0::2])
    assert torch.equal(out[1::2], torch.zeros_like(out[1::2]))


def test_unsynchronized_side_stream_launch_does_not_fault():
    junk = torch.full((128,), -(1 << 30), dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    del junk
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # the default stream is busy while kv_start's zeros wait behind it
    start = torch.zeros(1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        triton_attention.attention(q, k, k, None, None, start)
    torch.cuda.synchronize()  # raises on an illegal access


@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 1024), (781, 1823)])
def test_matmul_every_m_bucket_gives_the_bits_of_the_largest_m(k, n):
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    x = torch.randn(8192, k, device="cuda", dtype=torch.bfloat16)
    full = triton_matmul.mm(x, w)
    bad = [m for m in bench.INVARIANCE_M + (3, 31, 100, 300, 777, 3000, 5000)
           if not bench.same_bits(triton_matmul.mm(x[:m], w), full[:m])]
    assert not bad


def test_bench_sections_run_in_one_process():
    # matmul, rmsnorm and decode in one process once ended in an illegal memory access
    report = bench.run("test", quick=True, sections=("matmul", "rmsnorm", "decode"))
    torch.cuda.synchronize()
    assert report.checks and all(c.ok for c in report.checks), [c for c in report.checks if not c.ok]
    assert {r.group for r in report.rows} == {"matmul", "rmsnorm", "decode attention"}
