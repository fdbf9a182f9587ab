"""The Wilson score interval: how far a rate seen in a few runs can be from the true one.

Wilson (1927), "Probable inference, the law of succession, and statistical inference": unlike the
normal approximation it stays inside [0, 1] and is honest at 0 of N, where the normal interval has
zero width. Pure Python; used by the probe's confidence (probes/core/confidence.py) and the gate's
max-flip-rate policy.
"""

import math

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half) if k else 0.0, min(1.0, centre + half) if k < n else 1.0


def runs_to_bound(rate: float, z: float = Z95) -> int:
    """The fewest runs whose upper bound with 0 flips is below `rate` (how many runs would decide).
    With k = 0 the Wilson upper bound is z^2 / (n + z^2)."""
    return math.floor(z * z * (1 - rate) / rate) + 1
