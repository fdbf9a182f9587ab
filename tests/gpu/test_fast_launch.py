"""Eager launches past Triton's binder (launch._FastLaunch) give the JIT's bits, and a call that
Triton would specialize differently (another alignment, another integer class) never reuses a
binary made for another: each check runs the same call with FAST_LAUNCH off and on, twice on."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from nondet.kernels import launch, ops, triton_attention, triton_matmul, triton_rows  # noqa: E402


def _both(fn, monkeypatch):
    """fn() through the JIT, then through the fast launcher twice (the 2nd launch reuses a binary)."""
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    slow = fn()
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    return slow, fn(), fn()


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _data(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(seed))


@pytest.mark.parametrize("m", [1, 7, 64, 512])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_bits_with_the_fast_launch(m, bias, monkeypatch):
    a, w = _data(m, 1024), _data(768, 1024, seed=1)
    b = _data(768, seed=2) if bias else None
    slow, first, again = _both(lambda: triton_matmul.mm(a, w.t(), b), monkeypatch)
    assert torch.equal(_bits(slow), _bits(first)) and torch.equal(_bits(slow), _bits(again))


def test_the_fast_launch_reuses_a_binary_only_for_the_same_specialization(monkeypatch):
    # the pointer kernel on a row view 1 element into its storage (2 bytes: not 16-byte aligned) and
    # with K = 1000 (not a multiple of 16) after aligned, K = 1024 calls of the same tile shape
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    base = _data(65 * 1024 + 1)
    w = _data(512, 1024, seed=1)
    aligned = base[:64 * 1024].view(64, 1024)
    shifted = base[1:64 * 1024 + 1].view(64, 1024)
    for a in (aligned, aligned, shifted, shifted):
        fast = triton_matmul.mm(a, w.t(), split=False)
        monkeypatch.setattr(launch, "FAST_LAUNCH", False)
        slow = triton_matmul.mm(a, w.t(), split=False)
        monkeypatch.setattr(launch, "FAST_LAUNCH", True)
        assert torch.equal(_bits(fast), _bits(slow))
    narrow = _data(64, 1000, seed=3)
    fast = triton_matmul.mm(narrow, _data(512, 1000, seed=4).t(), split=False)
    assert (fast.float() - narrow.float() @ _data(512, 1000, seed=4).float().t()).abs().max() < 1.0
    kinds = launch._fast_launcher(triton_matmul._mm_kernel).binaries
    assert len({key[1:] for key in kinds}) >= 3  # aligned, shifted and K = 1000 each have a key of their own


@pytest.mark.parametrize("rows", [1, 5, 512])
def test_row_kernels_with_the_fast_launch(rows, monkeypatch):
    x, w = _data(rows, 4096), _data(4096, seed=1)
    for fn in (lambda: triton_rows.mean_last(x), lambda: triton_rows.rms_norm(x, w),
               lambda: triton_rows.softmax(x.float(), log=True), lambda: triton_rows.layer_norm(x, w, w)[0]):
        slow, first, again = _both(fn, monkeypatch)
        assert torch.equal(_bits(slow), _bits(first)) and torch.equal(_bits(slow), _bits(again))


@pytest.mark.parametrize("nq,s", [(512, 512), (1, 2048), (4, 4096)])
def test_attention_with_the_fast_launch(nq, s, monkeypatch):
    q, k, v = _data(2, 32, nq, 128), _data(2, 8, s, 128, seed=1), _data(2, 8, s, 128, seed=2)
    mask = torch.ones(2, 1, nq, s, dtype=torch.bool, device="cuda").tril(s - nq)
    mask[1, :, :, :3] = False  # left padding in row 1
    for m in (None, mask):
        slow, first, again = _both(lambda: ops.attention(q, k, v, m), monkeypatch)
        assert torch.equal(_bits(slow), _bits(first)) and torch.equal(_bits(slow), _bits(again))


def test_fast_launch_follows_the_current_stream(monkeypatch):
    # on a side stream the input is written after a sleep: a launch on another stream would read zeros
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    a, w = _data(64, 1024), _data(512, 1024, seed=1)
    expected = triton_matmul.mm(a, w.t())
    late = torch.zeros_like(a)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(2):  # once to make the key, once through the kept binary
            late.zero_()
            torch.cuda._sleep(int(1e8))
            late.copy_(a)
            out = triton_matmul.mm(late, w.t())
            torch.cuda.current_stream().synchronize()
            assert torch.equal(_bits(out), _bits(expected))
