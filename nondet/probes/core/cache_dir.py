"""nondet's cache directory: built models, converted demo weights, Inductor's compile caches."""

import os
from pathlib import Path


def cache_root() -> Path:
    """Where built artefacts live; NONDET_CACHE overrides (tests point it at a temp dir)."""
    env = os.environ.get("NONDET_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nondet"
