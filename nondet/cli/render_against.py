"""The terminal table of `nondet probe --endpoint A --against B`: each side, then across."""

from rich.console import Console
from rich.table import Table

from nondet.fmt import fmt_step

CAPTION = ("texts: distinct completions; token / bits: first step whose token / logprob bits differ from the "
           "side's own request sent alone (across: B alone vs A alone, the run's reference)")


def print_against(summary: dict, console: Console) -> None:
    section = summary.get("against")
    if section:
        console.print(against_table(section))


def against_table(section: dict) -> Table:
    table = Table(title=f"two deployments, compared at level {section['compare_level']}", caption=CAPTION)
    for col in ("side", "endpoint", "runs", "texts", "token", "bits"):
        table.add_column(col, justify="left" if col in ("side", "endpoint") else "right")
    for s in section["sides"]:
        table.add_row(s["side"], s["endpoint"], str(s["n_runs"]), str(s["distinct_completions"]),
                      fmt_step(s["first_token_divergence"]), _bits(s["first_numeric_divergence"], section))
    across = section["across"]
    table.add_row("A vs B", "alone vs alone", "", str(across["distinct_completions"]),
                  fmt_step(across["first_token_divergence"]), _bits(across["first_logprob_divergence"], section))
    return table


def _bits(step, section: dict) -> str:
    return "n/a" if section["across"]["logprobs_na"] else fmt_step(step)
