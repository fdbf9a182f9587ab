"""The terminal table of the prefill axis: each prefix length and chunk size against one-pass
prefill, one table per kernels mode (summary.json "prefill")."""

from rich.console import Console
from rich.table import Table

from nondet.fmt import fmt_prefill_form, fmt_step, prefill_order

COLUMNS = ("prefill", "texts", "flips", "bits differ", "token", "bits")
CAPTION = ("each prompt alone (batch size 1), its prefill in pieces vs in one pass. texts: distinct completions, "
           "worst prompt (1 = same tokens); flips / bits differ: prompts whose tokens / logprob bits differ; "
           "token / bits: first step whose token / logprob bits differ")


def print_prefill(summary: dict, console: Console) -> None:
    section = summary.get("prefill")
    modes = list(dict.fromkeys(f["kernels"] for f in (section or {}).get("by_form", [])))
    for mode in modes:  # the caption once, under the last table
        console.print(prefill_table(mode, [f for f in section["by_form"] if f["kernels"] == mode],
                                    CAPTION if mode == modes[-1] else None))
    for form in (section or {}).get("not_run", []):
        console.print(f"prefill {form}: not run, every prompt is {form.partition(':')[2]} tokens or shorter")


def prefill_table(mode: str, forms: list[dict], caption: str | None = CAPTION) -> Table:
    table = Table(title=f"prefix cache and chunked prefill vs one pass, kernels: {mode}", caption=caption)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "prefill" else "right")
    for f in sorted(forms, key=prefill_order):
        table.add_row(fmt_prefill_form(f), str(f["distinct_completions"]), f"{f['prompts_diverged']}/{f['n_prompts']}",
                      f"{f['prompts_bits_differ']}/{f['n_prompts']}", fmt_step(f["first_token_divergence"]),
                      fmt_step(f["first_numeric_divergence"]))
    return table

