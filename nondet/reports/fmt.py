"""Formatting of numbers, steps and stored float.hex values for the report (no torch)."""

import re
import shlex

import pandas as pd

from nondet.rundir import hex_to_float

def fmt_step(v) -> str:
    return "—" if v is None or pd.isna(v) else str(int(v))


def fmt_float(v) -> str:
    return "—" if v is None or pd.isna(v) else f"{v:.3g}"


def fmt_margin(h: str | None) -> str:
    """A top1-top2 logit margin; zero is an exact tie, broken by token order alone."""
    return "0 (exact tie)" if h is not None and hex_to_float(h) == 0 else fmt_hex(h)


def fmt_hex(h: str | None) -> str:
    """A stored float.hex value as a short decimal, with the exact value beside it."""
    return "—" if h is None else f"{hex_to_float(h):.3g} ({short_hex(h)})"


def short_hex(h: str) -> str:
    """float.hex without the mantissa's trailing zeros: 0x1.8000000000000p-3 -> 0x1.8p-3 (same value)."""
    return re.sub(r"(\.[0-9a-f]*?)0+p", r"\1p", h).replace(".p", "p")


def run_dir_arg(t) -> str:
    return shlex.quote(str(t.path))
