"""Triton's cache key hashed in a thread while the probe imports and loads the model.

The first Triton launch of a process computes `triton.runtime.cache.triton_key()`: a SHA-256 of Triton's
compiler sources and of its libtriton shared library, read in 1 MiB chunks (0.43 s of a warm GPU probe on an
H200, under our first launch; docs/benchmarks.md, 2026-12-02). hashlib and file reads release the GIL, so a
thread started before the model's load does most of it beside the main thread's imports. The function is
lru_cached: the launch then finds it done; one that comes first computes it itself, with the same result.
Nothing numeric changes: it is the key Triton would have computed.
"""

import threading


def start_triton_key() -> threading.Thread | None:
    """Start hashing Triton's cache key in a daemon thread; None where Triton or the function is missing."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # another Triton layout: the first launch computes it, as without this
        return None
    thread = threading.Thread(target=_quietly, args=(triton_key,), name="nondet-triton-key", daemon=True)
    thread.start()
    return thread


def _quietly(compute) -> None:
    try:
        compute()
    except Exception:  # an unreadable file: the first launch meets it and says so, as without this thread
        pass
