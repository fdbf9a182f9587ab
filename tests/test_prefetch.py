"""Triton's cache key hashed in a thread (nondet/kernels/prefetch.py): the key the first launch would compute.

Control: the cache starts empty (cleared), so the thread, not an earlier launch, filled it. On a CPU device, or
with NONDET_PREFETCH=0, no thread starts (the GPU's side: tests/gpu/test_prefetch_gpu.py)."""

import pytest

cache = pytest.importorskip("triton.runtime.cache")

from nondet.kernels.prefetch import ENV, start, start_triton_key  # noqa: E402


def test_the_thread_leaves_the_key_a_launch_would_compute():
    cache.triton_key.cache_clear()
    assert cache.triton_key.cache_info().currsize == 0
    thread = start_triton_key()
    thread.join(60)
    assert not thread.is_alive()
    assert cache.triton_key.cache_info().currsize == 1  # filled by the thread
    hits = cache.triton_key.cache_info().hits
    key = cache.triton_key()
    assert cache.triton_key.cache_info().hits == hits + 1  # served, not computed again
    assert key == cache.triton_key.__wrapped__() and len(key) > 64  # the same key, computed afresh


def test_no_thread_on_a_cpu_or_when_turned_off(monkeypatch):
    assert start("cpu") == []
    monkeypatch.setenv(ENV, "0")
    assert start("cuda") == []
