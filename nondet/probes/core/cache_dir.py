"""nondet's cache directory: built models, converted demo weights, Inductor's and Triton's compile caches."""

import contextlib
import os
from pathlib import Path

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def cache_root() -> Path:
    """Where built artefacts live; NONDET_CACHE overrides (tests point it at a temp dir)."""
    env = os.environ.get("NONDET_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nondet"


@contextlib.contextmanager
def triton_cache():
    """Triton's compiled kernels under NONDET_CACHE/triton for the scope, unless TRITON_CACHE_DIR is set (the
    user's is kept). The batch-invariant kernels compile a binary per tile, once per machine (19 for the GPU
    probe case on an H200, about 10 s: docs/benchmarks.md, 2026-11-30): a CI workflow that keeps nondet's cache
    between runs then keeps them too. Restored on exit to what it was, whatever set it within (Inductor sets its
    own the first time it compiles); processes started in the scope inherit it."""
    before = os.environ.get(TRITON_CACHE_ENV)
    if before is None:
        os.environ[TRITON_CACHE_ENV] = str(cache_root() / "triton")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRITON_CACHE_ENV, None)
        else:
            os.environ[TRITON_CACHE_ENV] = before
