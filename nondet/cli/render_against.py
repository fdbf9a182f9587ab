"""The terminal table of `nondet probe --endpoint A --against B`: each side, then across."""

from rich.console import Console
from rich.table import Table

from nondet.fmt import DASH, fmt_step

CAPTION = ("texts: distinct completions; token / bits: first step whose token / logprob bits differ from the "
           "side's own request sent alone (across: B alone vs A alone, the run's reference)")


def print_against(summary: dict, console: Console) -> None:
    section = summary.get("against")
    if section:
        console.print(against_table(section))


def against_table(section: dict) -> Table:
    what = ("two engines (a cross-engine comparison: expected to differ from step 0, not batch variance)"
            if section.get("cross_engine") else "two deployments")
    table = Table(title=f"{what}, compared at level {section['compare_level']}", caption=CAPTION)
    for col in ("side", "endpoint", "engine", "runs", "texts", "token", "bits"):
        table.add_column(col, justify="left" if col in ("side", "endpoint", "engine") else "right")
    for s in section["sides"]:
        table.add_row(s["side"], s["endpoint"], s.get("engine") or DASH, str(s["n_runs"]),
                      str(s["distinct_completions"]), fmt_step(s["first_token_divergence"]),
                      _bits(s["first_numeric_divergence"], section))
    across = section["across"]
    table.add_row("A vs B", "alone vs alone", "", "", str(across["distinct_completions"]),
                  fmt_step(across["first_token_divergence"]), _bits(across["first_logprob_divergence"], section))
    return table


def _bits(step, section: dict) -> str:
    return "n/a" if section["across"]["logprobs_na"] else fmt_step(step)
