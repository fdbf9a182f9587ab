"""Seeded arrival schedules for filler traffic (pure Python, no torch).

Every run draws from its own `random.Random`, seeded from (probe seed, run index), so the
arrival pattern of a run is reproducible and differs between runs.
"""

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    at: float  # continuous: engine step; server: seconds after the burst starts
    filler: int  # index into the filler texts
    max_new_tokens: int  # fillers leave at different times, so the batch keeps changing


def run_rng(seed: int, run: int) -> random.Random:
    return random.Random(f"nondet-load/{seed}/{run}")  # str seeds are hashed: stable across Pythons


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson(mean) draw (Knuth; means here are small)."""
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def per_step(rng: random.Random, rate: float, count: int, n_texts: int, longest: int) -> list[Arrival]:
    """`count` fillers; arrivals per engine step ~ Poisson(rate); lengths uniform in [1, longest]."""
    arrivals: list[Arrival] = []
    step = 0
    while len(arrivals) < count:
        for _ in range(min(poisson(rng, rate), count - len(arrivals))):
            arrivals.append(_filler(rng, step, n_texts, longest))
        step += 1
    return arrivals


def per_second(rng: random.Random, rate: float, count: int, n_texts: int, longest: int) -> list[Arrival]:
    """`count` fillers; exponential gaps of mean 1/rate seconds (a Poisson process)."""
    arrivals, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        arrivals.append(_filler(rng, t, n_texts, longest))
    return arrivals


def _filler(rng: random.Random, at: float, n_texts: int, longest: int) -> Arrival:
    return Arrival(at, rng.randrange(n_texts), rng.randint(1, longest))
