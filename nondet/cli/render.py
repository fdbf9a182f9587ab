"""Rich rendering of probe summaries (tables, branch tokens), shared by probe and gate."""

from functools import partial

from rich.console import Console
from rich.table import Table
from rich.text import Text

from nondet.cli.fit import fitted
from nondet.fmt import ahead_note, breaks_note, fmt_hex_value, fmt_step, saved_steps_note
from nondet.text import quoted, shorten
from nondet.verdict import confidence_line, graph_census_line, sampler_lines

visible = quoted  # model text on the terminal (cli/bisect.py imports it by this name)


def print_probe_summary(summary: dict, run_dir, console: Console) -> None:
    for mode, m in summary["modes"].items():
        table = _prompts_table if m.get("prompts") else _conditions_table
        console.print(fitted(console, partial(table, mode, m), partial(table, mode, m, narrow=True)))
        tree = m.get("branch_tree")
        if tree:
            prompt = f"prompt {m['branch_prompt_id']}: " if m.get("prompts") else ""
            console.print(Text(prompt) + branch_line(tree))
    if len(summary["modes"]) > 1:
        console.print(_side_by_side(summary["modes"], summary.get("tensor_parallel")))
    console.print(Text(summary["verdict"], style="bold"))
    for mode, m in summary["modes"].items():
        if m.get("confidence"):
            console.print(confidence_line(f"{mode} kernels", m["confidence"]))
    for line in sampler_lines(summary):
        console.print(line)
    coverage = summary.get("kernel_coverage") or {}
    if coverage.get("injected_control"):
        console.print(f"note: {coverage['injected_control']}")
    for mode, m in summary["modes"].items():
        if m.get("routing"):
            console.print(f"{mode}: {routing_count_line(m['routing'])}")
    if summary.get("decode_path"):
        for line in decode_path_lines(summary["decode_path"]):
            console.print(line)
    for mode, outcome in summary.get("decoded_ahead", {}).items():  # eager: the mode's second process
        if ahead_note(outcome):
            console.print(f"{mode}: {outcome}")
    if summary.get("compiled_graph_census"):
        console.print(graph_census_line(summary["compiled_graph_census"]))
    console.print(f"run directory: {run_dir}")


def decode_path_lines(d: dict) -> list[str]:
    """--compile / --cuda-graphs: per kernels mode, the path it decoded on and the time spent compiling (or
    recording) apart from decoding."""
    lines = []
    recorded = d.get("backend") == "cuda-graphs"  # --cuda-graphs: recorded, not compiled
    for mode, m in d["modes"].items():
        if m["path"] != "eager":
            shapes = f" ({m['warm_ups']} batch shapes{graphs_note(m)})" if m.get("warm_ups") else ""  # older run dirs lack it
            lines.append(f"{mode}: {d['compiled']}; {'record' if recorded else 'compile'} + warm-up "
                         f"{m['warmup_s']:.1f} s{shapes}, "
                         f"decode {m['measured_s']:.1f} s over {m['conditions']} calls" + breaks_note(m)
                         + saved_steps_note(d.get("precompiled", {}).get(mode, {}))
                         + ahead_note(d.get("compiled_ahead", {}).get(mode)))
        else:
            lines.append(f"{mode}: eager, static KV cache (could not {'record' if recorded else 'compile'}: "
                         f"{m['reason']}); "
                         f"decode {m['measured_s']:.1f} s")
    return lines


def graphs_note(m: dict) -> str:
    """', N graphs traced' (dynamo's compiles during the mode's warm-ups; 0 where saved steps were loaded), or on
    the CUDA-graph path the graphs recorded and the steps replayed from them."""
    if "graphs_recorded" in m:  # --cuda-graphs: nothing traced
        return f", {m['graphs_recorded']} CUDA graphs recorded, {m['steps_replayed']} steps replayed"
    if "graphs_traced" not in m:  # older run dirs lack it
        return ""
    n = m["graphs_traced"]
    return f", {n} graph{'' if n == 1 else 's'} traced"


def routing_count_line(r: dict) -> str:
    """A mixture of experts: how many runs sent a token to other experts than its reference did."""
    if not r["runs_changed"]:
        return f"routing: same experts as the reference in all {r['runs']} runs"
    first = r["first"]
    return (f"routing changed in {r['runs_changed']} of {r['runs']} runs "
            f"(first at step {first['step']}, MoE layer {first['layer']})")


def _conditions_table(mode: str, m: dict, narrow: bool = False) -> Table:
    ref = m["reference_run_id"]
    table = Table(title=f"kernels: {mode}  (each run vs run {ref}: the prompt alone)" if narrow else
                  f"kernels: {mode}  (every run is compared with reference run {ref}: the prompt sent alone)",
                  min_width=LEGEND_WIDTH if narrow else None)
    for col in ("condition", "runs", "distinct", *_divergence_headers(narrow)):
        table.add_column(col, justify="left" if col == "condition" else "right")
    for c in m["conditions"]:
        table.add_row(c["condition_id"].split("/", 1)[1], str(c["n_runs"]), str(c["distinct_completions"]),
                      _step(c["first_token_divergence"]), numeric_step(c["first_numeric_divergence"], m))
    table.caption = (f"{m['distinct_completions']} distinct completion(s) over {m['n_runs']} runs; "
                     f"most common x{m['most_common_count']}\n{LEGEND if narrow else NUMERIC_NOTE}")
    return table


def _prompts_table(mode: str, m: dict, narrow: bool = False) -> Table:
    """Several prompts: one row per prompt (its conditions are in the report)."""
    table = Table(title=f"kernels: {mode}  (each prompt's runs vs that prompt alone)" if narrow else
                  f"kernels: {mode}  (each prompt's runs are compared with that prompt sent alone)",
                  min_width=LEGEND_WIDTH if narrow else None)
    for col in ("prompt", "text", "runs", "distinct", *_divergence_headers(narrow)):
        table.add_column(col, justify="left" if col in ("prompt", "text") else "right", no_wrap=col == "text")
    for p in m["prompts"]:
        table.add_row(f"p{p['prompt_id']}", Text(shorten(quoted(p.get("prompt", "")), 30)), str(p["n_runs"]),
                      str(p["distinct_completions"]), _step(p["first_token_divergence"]),
                      numeric_step(p["first_numeric_divergence"], m))
    table.caption = (f"tokens differ on {m['prompts_diverged']} of {m['n_prompts']} prompts; "
                     f"{m['n_runs']} runs in all\n{LEGEND if narrow else NUMERIC_NOTE}")
    return table


def _divergence_headers(narrow: bool) -> tuple[str, str]:
    """The two divergence columns' headers: in full, or one word each where the full ones don't fit."""
    return ("token", "numeric") if narrow else ("first token divergence", "first numeric divergence")


NUMERIC_NOTE = "numeric divergence: first step whose sampled-token logprob bits differ from the reference"
# under a narrow table (each line under 80 columns): what its one-word divergence headers stand for
LEGEND = ("token: first step whose token differs from the reference\n"
          "numeric: first step whose sampled-token logprob bits differ from it")
LEGEND_WIDTH = max(map(len, LEGEND.splitlines()))  # a narrow table is as wide as its legend: no line wraps


def numeric_step(value, mode: dict) -> str:
    """A first numeric divergence, or why there is none to show (a server that sent no logprobs)."""
    if mode.get("numeric_na"):
        return f"n/a ({mode['numeric_na']})"
    return _step(value)


def branch_line(tree: dict) -> Text:
    """'step 93: ' Queens' x7 (margin 0.012) / ' New' x2 (margin 0.004)' for the first branch."""
    line = Text(f"branch at step {tree['step']}: ", style="bold")
    line.append(f"…{quoted(tree['prefix_text'][-40:])} -> ")
    parts = []
    for alt in tree["alternatives"]:
        ref = " (reference)" if alt["is_reference"] else ""
        parts.append(f"{quoted(alt['piece'])} x{alt['count']}{ref} margin {fmt_hex_value(alt['margin'])}")
    line.append(" / ".join(parts))
    return line


def _side_by_side(modes: dict, tensor_parallel: dict | None = None) -> Table:
    # --tp: every run against the reference degree's, so a change of degree shows here too (the verdict
    # below splits the two)
    caption = None if not tensor_parallel else (
        f"runs of every degree against TP{tensor_parallel['reference_degree']}'s reference; below: each degree apart")
    table = Table(title="confirm: default vs batch-invariant kernels", caption=caption)
    table.add_column("")
    for mode in modes:
        table.add_column(mode, justify="right")
    for key, label in (("distinct_completions", "distinct completions"), ("n_runs", "runs"),
                       ("first_token_divergence", "first token divergence"),
                       ("first_numeric_divergence", "first numeric divergence")):
        show = numeric_step if key == "first_numeric_divergence" else (lambda v, _m: _step(v))
        table.add_row(label, *(show(m[key], m) for m in modes.values()))
    return table


def _step(value) -> str:
    return fmt_step(value, missing="-")
