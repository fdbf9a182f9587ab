"""Axis scales (data value -> fraction of the axis) and their "nice" ticks, for svg.py's panels.

A scale maps its domain [lo, hi] onto [0, 1]; the panel turns that fraction into pixels.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Linear:
    lo: float
    hi: float

    def frac(self, v: float) -> float:
        return (v - self.lo) / ((self.hi - self.lo) or 1.0)


@dataclass(frozen=True)
class Log:
    lo: float  # > 0
    hi: float

    def frac(self, v: float) -> float:
        lo, hi = math.log10(self.lo), math.log10(self.hi)
        return (math.log10(max(v, 1e-300)) - lo) / ((hi - lo) or 1.0)


@dataclass(frozen=True)
class Symlog:
    """Linear within +-linthresh, logarithmic beyond (matplotlib's symlog, base 10, linscale 1): a
    difference of exactly 0 (bit-identical) has a place on the axis, which a log scale cannot give it."""

    linthresh: float
    lo: float
    hi: float

    def _f(self, v: float) -> float:
        a = abs(v) / self.linthresh
        return math.copysign(a if a <= 1 else 1 + math.log10(a), v)

    def frac(self, v: float) -> float:
        lo, hi = self._f(self.lo), self._f(self.hi)
        return (self._f(v) - lo) / ((hi - lo) or 1.0)


def nice_step(span: float, max_ticks: int = 6, integer: bool = False) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that splits `span` into at most `max_ticks` - 1 steps."""
    raw = max(span, 1e-300) / max(1, max_ticks - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * (1 - 1e-9))
    return max(1.0, round(step)) if integer else step


def nice_ticks(lo: float, hi: float, max_ticks: int = 6, integer: bool = False) -> list[float]:
    """Evenly spaced round ticks whose first is <= lo and last >= hi (an axis drawn from the first
    tick to the last covers the data)."""
    if hi <= lo:
        hi = lo + 1
    step = nice_step(hi - lo, max_ticks, integer)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [_clean(k * step) for k in range(first, last + 1)]


def ticks_within(lo: float, hi: float, max_ticks: int = 6, integer: bool = False) -> list[float]:
    """nice_ticks that lie inside a fixed domain [lo, hi] (an axis whose limits are given)."""
    return [t for t in nice_ticks(lo, hi, max_ticks, integer) if lo - 1e-9 <= t <= hi + 1e-9]


def log_ticks(lo: float, hi: float, max_ticks: int = 8) -> list[float]:
    """Ticks around [lo, hi] (lo > 0), the first <= lo and the last >= hi: 1, 2, 5 x 10^e where at most
    `max_ticks` of them do it, else powers of 10, every k-th decade over a long range."""
    if hi <= lo * (1 + 1e-9):  # one value: a decade's room around it
        lo, hi = lo / 2, hi * 2
    e_lo, e_hi = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    candidates = [_clean(m * 10.0 ** e) for e in range(e_lo, e_hi + 1) for m in (1, 2, 5)]
    start = max(t for t in candidates if t <= lo * (1 + 1e-9))
    stop = min(t for t in candidates if t >= hi * (1 - 1e-9))
    fine = [t for t in candidates if start <= t <= stop]
    if len(fine) <= max_ticks:
        return fine
    k = math.ceil((e_hi - e_lo) / max(1, max_ticks - 1))
    return [_clean(10.0 ** e) for e in range(e_lo, e_hi + k, k) if e - k < e_hi]


def symlog_ticks(linthresh: float, hi: float, max_ticks: int = 8) -> list[float]:
    """0, then log ticks from about linthresh up to hi (the axis runs from 0 to hi)."""
    return [0.0] + [t for t in log_ticks(linthresh, hi, max_ticks - 1) if linthresh * (1 - 1e-9) <= t <= hi]


def fmt_tick(v: float) -> str:
    """A linear tick: as few digits as it needs (2.5, 10, 0.001)."""
    return f"{v:.6g}" if v else "0"


def fmt_power(v: float) -> str:
    """A log or symlog tick: 1e-3, 5e-2, 0."""
    if not v:
        return "0"
    mantissa, exponent = f"{v:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _clean(v: float) -> float:
    """Round off the float noise of k * step (0.30000000000000004 -> 0.3)."""
    return float(f"{v:.12g}")
