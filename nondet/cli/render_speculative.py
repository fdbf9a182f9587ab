"""The terminal table of a speculative probe: each form against plain greedy, per kernels mode."""

from rich.console import Console
from rich.table import Table

from nondet.fmt import fmt_fixed, fmt_percent, fmt_step, fmt_times
from nondet.verdict import undrafted_line

COLUMNS = ("form", "texts", "flips", "token", "bits", "accept", "tok/s", "plain", "gain", "round")
CAPTION = ("texts: distinct completions of plain greedy and the form, worst prompt (1 = same tokens); flips: "
           "prompts whose tokens differ; token / bits: first step whose token / logprob bits differ; "
           "accept: drafted tokens kept; tok/s: with speculation, plain: without; gain: tok/s / plain; round: a "
           "verification round's time in plain steps (gain = tokens per round / round; compare kernels modes here, "
           "their acceptance differs with their token streams)")


def print_speculative(summary: dict, console: Console) -> None:
    section = summary.get("speculative")
    if not section:
        return
    for mode in dict.fromkeys(f["kernels"] for f in section["by_form"]):
        console.print(speculative_table(mode, [f for f in section["by_form"] if f["kernels"] == mode]))
    for line in filter(None, map(undrafted_line, section["by_form"])):
        console.print(f"[yellow]{line}[/yellow]", highlight=False)


def speculative_table(mode: str, forms: list[dict]) -> Table:
    table = Table(title=f"speculative decoding vs plain greedy, kernels: {mode}  (batch size 1)", caption=CAPTION)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "form" else "right")
    for f in forms:
        table.add_row(f["speculative"], str(f["distinct_completions"]), f"{f['prompts_diverged']}/{f['n_prompts']}",
                      fmt_step(f["first_token_divergence"]), fmt_step(f["first_numeric_divergence"]),
                      fmt_percent(f["acceptance_rate"]), fmt_fixed(f["tokens_per_s"]), fmt_fixed(f["reference_tokens_per_s"]),
                      fmt_times(f["speedup"]), fmt_fixed(f.get("round_cost"), 2))
    return table
