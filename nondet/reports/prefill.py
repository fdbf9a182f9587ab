"""The report's "Prefix cache and chunked prefill" section: each form and size against one-pass
prefill (summary.json's "prefill" section, written by the static source), a table and a figure.
Absent for probes without --prefix-cache / --chunked-prefill."""

from nondet.fmt import fmt_prefill_form, fmt_step, prefill_order
from nondet.reports import figures
from nondet.reports.blocks import Para, Section, Table, figure_or_hint
from nondet.reports.tables import RunTables

HEADER = ["prefill", "kernels", "prompts", "distinct vs one pass", "prompts diverged", "prompts whose bits differ",
          "first token divergence", "first numeric divergence"]


def prefill_sections(t: RunTables) -> list[Section]:
    section = t.summary.get("prefill")
    if not section or not section.get("by_form"):
        return []
    forms = sorted(section["by_form"], key=lambda f: (*prefill_order(f), f["kernels"]))
    rows = [[fmt_prefill_form(f), f["kernels"], fmt_step(f["n_prompts"]), fmt_step(f["distinct_completions"]),
             f"{f['prompts_diverged']} of {f['n_prompts']}", f"{f['prompts_bits_differ']} of {f['n_prompts']}",
             fmt_step(f["first_token_divergence"]), fmt_step(f["first_numeric_divergence"])] for f in forms]
    note = Para(["Each prompt runs alone (batch size 1) and is compared with itself prefilled in one forward. "
                 "Prefix N cached: the first N tokens' KV cache was left by an earlier request (a warm prefix "
                 "cache) and the rest is prefilled on top of it. Chunks of C: the prompt is prefilled C tokens a "
                 "forward, as a server's chunked prefill does under a token budget. Fewer rows per matmul and keys "
                 "split between cache and call change a batch-variant kernel's reduction order; the "
                 "batch-invariant kernels must give the same bits for every split."], kind="note")
    figure = figure_or_hint("prefill.svg", figures.prefill_divergence(t), "Prefill axis: first divergence per form",
                            ["Per form and size, each kernels mode's first step whose logprob bits differ from "
                             "one-pass prefill (filled), whose token differs (cross), or none (hollow, at the "
                             "right edge). Earliest over the prompts."], ["No prefill runs: nothing to plot."])
    cold = [Para([f"Cold cache: {section['cold']}."], kind="note")] if section.get("cold") else []
    return [Section("Prefix cache and chunked prefill", "prefill",
                    [Table(HEADER, rows, [False, False] + [True] * 6), note, *cold, *figure])]
