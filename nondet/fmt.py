"""How numbers, steps and stored float.hex values look: the report's and the terminal's one set.

No pandas, no torch: probes, reports and the CLI all use it. A missing value is `—` in the
report; the terminal passes its own (`-`, `?`) as `missing`.
"""

import re
import shlex

from nondet.rundir import hex_to_float

DASH = "—"  # a value that is not there (None, NaN, pandas' NA)


def is_missing(v) -> bool:
    """None, NaN or pandas' NA: a table cell with no value."""
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN is the one value unequal to itself
    except TypeError:  # pandas.NA: its comparisons are NA, whose truth is undefined
        return True


def fmt_step(v, missing: str = DASH) -> str:
    """A step, index or count."""
    return missing if is_missing(v) else str(int(v))


def fmt_float(v, digits: int = 3, missing: str = DASH) -> str:
    """A float to `digits` significant digits."""
    return missing if is_missing(v) else f"{v:.{digits}g}"


def fmt_percent(v, missing: str = DASH) -> str:
    """A fraction in [0, 1] as a percentage with one decimal."""
    return missing if is_missing(v) else f"{100 * v:.1f}%"


def fmt_fixed(v, decimals: int = 1, missing: str = DASH) -> str:
    """A rate or count with a fixed number of decimals (tokens/s)."""
    return missing if is_missing(v) else f"{v:.{decimals}f}"


def fmt_times(v, missing: str = DASH) -> str:
    """A ratio as a factor: 1.46x."""
    return missing if is_missing(v) else f"{v:.2f}x"


def fmt_hex(h: str | None, missing: str = DASH) -> str:
    """A stored float.hex value as a short decimal, with the exact value beside it; a table cell
    without one (a server that sent no logprobs beside one that did) is `missing`."""
    return missing if is_missing(h) else f"{hex_to_float(h):.3g} ({short_hex(h)})"


def fmt_margin(h: str | None) -> str:
    """A top1-top2 logit margin; zero is an exact tie, broken by token order alone."""
    return "0 (exact tie)" if not is_missing(h) and hex_to_float(h) == 0 else fmt_hex(h)


def fmt_hex_value(h: str | None, digits: int = 4, missing: str = "?") -> str:
    """A stored float.hex value as a decimal alone (the terminal's margins)."""
    return fmt_float(hex_to_float(h), digits, missing)


def short_hex(h: str) -> str:
    """float.hex without the mantissa's trailing zeros: 0x1.8000000000000p-3 -> 0x1.8p-3 (same value)."""
    return re.sub(r"(\.[0-9a-f]*?)0+p", r"\1p", h).replace(".p", "p")


def run_dir_arg(t) -> str:
    """The run directory of `t` (anything with .path) as one shell argument."""
    return shlex.quote(str(t.path))


def fmt_prefill_form(form: dict) -> str:
    """A summary.json prefill entry ({"kind", "size"}) in words: 'prefix 16 cached', 'chunks of 4'."""
    return f"prefix {form['size']} cached" if form["kind"] == "prefix" else f"chunks of {form['size']}"


def prefill_order(form: dict) -> tuple:
    """Sort key of prefill entries: the prefixes first, then the chunk sizes, each by size. A server's prefix
    of unknown length ("25%", ..., "all": its share of the prompt's text) sorts after the token counts, by share,
    so a run that mixes the two (usage reported for some requests only) still sorts."""
    size = form["size"]
    if isinstance(size, str):
        share = size.rstrip("%")
        return form["kind"] != "prefix", 1, 100.0 if size == "all" else float(share) if _is_number(share) else 101.0
    return form["kind"] != "prefix", 0, size


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def saved_steps_note(steps: dict) -> str:
    """'; steps loaded from NONDET_CACHE: batch 1, batch 2' (core/precompiled.py), and those compiled
    and saved, or compiled by transformers without saving (torch could not save them)."""
    groups = {"loaded from NONDET_CACHE": [], "compiled and saved": [], "compiled, not saved": []}
    for batch, what in steps.items():
        groups["compiled, not saved" if what.startswith("JIT") else "compiled and saved" if what.startswith("compiled")
               else "loaded from NONDET_CACHE"].append(batch)
    return "".join(f"; steps {name}: {', '.join(batches)}" for name, batches in groups.items() if batches)


def ahead_note(outcome: str | None) -> str:
    """'; compiled by a second process in 52.3 s (...)', '; 9 of the mode's 17 conditions decoded by a second
    process ...', or its failure (probes/static/compile_ahead.py); nothing where none was started (summary.json
    says why)."""
    return "" if not outcome or outcome.startswith("not started") else f"; {outcome}"


def breaks_note(m: dict) -> str:
    """'; N graph breaks (those pieces ran eager, ...)' for a compiled mode whose warm-up broke the graph."""
    n = m.get("graph_breaks") or 0
    return f"; {n} graph break{'s' if n != 1 else ''} (those pieces ran eager, outside CUDA graphs)" if n else ""
