"""Continuous load in process: the target inside transformers' continuous-batching engine.

    source.py        the continuous source (`--load continuous`): Poisson filler arrivals
    engine.py        the engine, stepped from this thread, fillers added on a schedule
    cb_attention.py  nondet's batch-invariant attention over the engine's paged cache
The rl axis samples through this engine too (rl/continuous.py). This package's __init__ imports nothing.
"""
