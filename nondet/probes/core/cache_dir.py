"""nondet's cache directory: built models, converted demo weights, Inductor's and Triton's compile caches."""

import contextlib
import os
from pathlib import Path
from typing import Callable

TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def cache_root() -> Path:
    """Where built artefacts live; NONDET_CACHE overrides (tests point it at a temp dir)."""
    env = os.environ.get("NONDET_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nondet"


def triton_cache():
    """Triton's compiled kernels under NONDET_CACHE/triton for the scope, unless TRITON_CACHE_DIR is set (the
    user's is kept). The batch-invariant kernels compile a binary per tile, once per machine (19 for the GPU
    probe case on an H200, about 10 s: docs/benchmarks.md, 2026-11-30): a CI workflow that keeps nondet's cache
    between runs then keeps them too. Restored on exit to what it was, whatever set it within (Inductor sets its
    own the first time it compiles); processes started in the scope inherit it."""
    return env_default(TRITON_CACHE_ENV, str(cache_root() / "triton"))


@contextlib.contextmanager
def env_default(name: str, value: str, users: Callable[[str | None], bool] = lambda v: v is not None):
    """The environment variable `name` set to value for the scope unless users(its value) says the value there is
    the user's (default: any value); restored on exit to what it was, whatever set it within."""
    before = os.environ.get(name)
    if not users(before):
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
