"""One-time process costs of a GPU probe paid in threads while the main thread imports and loads the model.

- Triton's cache key: the first Triton launch of a process computes `triton.runtime.cache.triton_key()`, a
  SHA-256 of Triton's compiler sources and of its libtriton shared library read in 1 MiB chunks (0.43 s of a
  warm GPU probe on an H200, under our first launch; docs/benchmarks.md, 2026-12-02). hashlib and file reads
  release the GIL. The function is lru_cached: the launch then finds it done; one that comes first computes
  it itself, with the same result.
- The device's libraries: the CUDA context (0.35-0.39 s on an H200 host, 2026-12-01), cuBLAS(Lt) loaded by a
  first matmul and the attention libraries by a first scaled_dot_product_attention, each on tiny tensors.
  What they load is process-wide; what the model later computes picks its kernels by its own shapes, as it
  would have (tests/gpu/test_prefetch_gpu.py holds a probe's streams to a probe without these threads).

NONDET_PREFETCH=0 starts neither. Nothing numeric changes at import: the threads start when a probe asks.
"""

import os
import threading

ENV = "NONDET_PREFETCH"


def start(device: str) -> list[threading.Thread]:
    """Both threads for a probe whose batch-invariant mode runs on `device` (a CUDA device string); none
    on another device or with NONDET_PREFETCH=0."""
    if os.environ.get(ENV, "1") == "0" or not device.startswith("cuda"):
        return []
    warm = _thread(lambda: _warm_device(device), "nondet-device-warm")
    return [t for t in (start_triton_key(), warm) if t is not None]


def start_triton_key() -> threading.Thread | None:
    """Start hashing Triton's cache key in a daemon thread; None where Triton or the function is missing."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # another Triton layout: the first launch computes it, as without this
        return None
    return _thread(triton_key, "nondet-triton-key")


def _thread(work, name: str) -> threading.Thread:
    """work() in a daemon thread, its failure left to the main thread to meet."""
    thread = threading.Thread(target=_quietly, args=(work,), name=name, daemon=True)
    thread.start()
    return thread


def _quietly(work) -> None:
    try:
        work()
    except Exception:  # a missing library, a busy device: the main thread meets it and says so, as without this
        pass


def _warm_device(device: str) -> None:
    import torch
    import torch.nn.functional as F

    where = torch.device(device)
    with torch.no_grad():
        a = torch.ones(64, 64, dtype=torch.bfloat16, device=where)  # the context, then cuBLAS(Lt)
        a @ a
        q = torch.ones(1, 2, 16, 64, dtype=torch.bfloat16, device=where)  # the attention backends' libraries
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.cuda.synchronize(where)
