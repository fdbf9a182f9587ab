"""`nondet bisect [RUN_DIR]`: where inside the model a divergence is born, and which kernel causes it."""

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app

TABLE_ROWS = 12  # differing modules shown per step; bisect_modules.csv holds them all


@app.command("bisect")
def bisect(
    run_dir: Annotated[Optional[Path], typer.Argument(
        metavar="RUN_DIR",
        help="A run directory written by `nondet probe`. Omitted: run a probe first (options below).")] = None,
    condition: Annotated[Optional[str], typer.Option(
        help="Condition to bisect, e.g. default/bs8/ends or bs8/ends. Default: the one that flips first.")] = None,
    position: Annotated[Optional[int], typer.Option(
        help="Target row of that condition. Default: its row that diverges first.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(
        help="Decode steps to replay. Default: through the probe's token flip (all steps if none).")] = None,
    ablation: Annotated[bool, typer.Option(
        "--ablation/--no-ablation", help="Rerun with batch-invariant kernels per op class (the causal test).")] = True,
    model: o.ModelOpt = None,
    prompt: o.PromptOpt = None,
    prompt_file: o.PromptFileOpt = None,
    batch_sizes: o.BatchSizesOpt = "1,2,4,8,16",
    max_new_tokens: o.MaxNewTokensOpt = 200,
    dtype: o.DtypeOpt = "bfloat16",
    device: o.DeviceOpt = "cpu",
    attn_implementation: o.AttnOpt = None,
    trust_remote_code: o.TrustOpt = False,
    threads: o.ThreadsOpt = None,
    out: o.OutOpt = None,
    json_output: o.JsonOpt = False,
) -> None:
    """Find the first (step, module, op class) where a divergent run's bits leave the reference's.

    Replays the reference (prompt alone) and one divergent condition of a probe in lockstep,
    both fed the reference's tokens, with hooks on every module capturing the target row
    only. Prints the origin, the first differing modules, and the kernel ablation: the
    divergent condition rerun with batch-invariant kernels for one op class at a time.
    Writes bisect.json, bisect_modules.csv and ablation.json into the run directory.

    Example:  nondet bisect nondet-runs/20261122-031500-probe --condition bs8/ends
    """
    from nondet.errors import UsageError
    from nondet.probes.bisect import BisectConfig

    if max_steps is not None and max_steps < 1:
        raise UsageError("--max-steps must be >= 1")
    if run_dir is not None and any(v is not None for v in (model, prompt, prompt_file, out)):
        raise UsageError("--model, --prompt, --prompt-file and --out apply only without RUN_DIR "
                         "(bisect reloads the probe's model and prompt from RUN_DIR/config.json)")
    if run_dir is None:
        run_dir = _probe_first(model, prompt, prompt_file, batch_sizes, max_new_tokens, dtype, device,
                               attn_implementation, trust_remote_code, threads, out, json_output)
    config = BisectConfig(str(run_dir), condition, position, max_steps, ablation)
    result = _run_with_status(config, quiet=json_output)
    from nondet.cli.probe import write_report_if_available

    write_report_if_available(result.run_dir)
    if json_output:
        print(json.dumps({"run_dir": str(result.run_dir), **result.bisect}, indent=1))
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped or logged: don't squeeze module paths into 80 columns
        console = Console(width=140)
    print_bisect(result.bisect, result.modules, console)
    console.print(f"run directory: {result.run_dir}")
    console.print(f"wall time: {result.seconds:.1f} s")


def _probe_first(model, prompt, prompt_file, batch_sizes, max_new_tokens, dtype, device, attn, trust, threads,
                 out, quiet) -> Path:
    """No RUN_DIR: run the probe (same options as `nondet probe`) to find a divergent condition."""
    from nondet.cli.options import read_prompt
    from nondet.cli.probe import run_with_progress
    from nondet.probes.conditions import parse_batch_sizes
    from nondet.probes.loading import ModelSpec
    from nondet.probes.probe import DEFAULT_PROMPT, ProbeConfig, default_run_dir

    config = ProbeConfig(
        prompt=read_prompt(prompt, prompt_file, DEFAULT_PROMPT),
        model=ModelSpec(model, dtype, device, attn, trust),
        batch_sizes=parse_batch_sizes(batch_sizes), max_new_tokens=max_new_tokens, threads=threads,
        out=str(out) if out else default_run_dir("bisect"), argv=tuple(["nondet"] + sys.argv[1:]),
    )
    result = run_with_progress(config, quiet=quiet)
    if not quiet:
        from rich.console import Console

        Console().print(f"probe: {result.summary['verdict']} ({result.seconds:.1f} s)")
    return result.run_dir


def _run_with_status(config, quiet: bool):
    """run_bisect with a status line on stderr naming the stage (none with --json)."""
    from rich.console import Console

    from nondet.probes.bisect import run_bisect

    if quiet:
        return run_bisect(config)
    with Console(stderr=True).status("bisect") as status:
        return run_bisect(config, lambda text: status.update(f"bisect: {text}"))


def print_bisect(b: dict, modules: list[dict], console) -> None:
    from rich.text import Text

    console.print(_origin_line(b))
    if b.get("reference_reproduced") is False:
        console.print("warning: the replayed reference's tokens differ from the probe's reference stream "
                      "(other threads, library versions or device?); attribution is for this replay",
                      style="yellow")
    steps = list(dict.fromkeys(s for s in (b["first_numeric_step"], b["flip_step"]) if s is not None))
    for step in steps:
        console.print(_modules_table(step, b, modules))
    if steps and b["amplification"]:
        console.print(_amplification_line(b["amplification"], steps))
    if b.get("ablation"):
        console.print(_ablation_table(b["ablation"]))
        minimal = b.get("minimal_set")
        console.print(Text("minimal set that removes the divergence: "
                           + (" + ".join(minimal) if minimal else "none found"), style="bold"))
    elif b["origin"] is not None:
        console.print("ablation: not run (--no-ablation, or a batch-invariant condition)")


def _origin_line(b: dict):
    from rich.text import Text

    from nondet.cli.render import visible

    origin = b["origin"]
    where = f"{b['condition_id']} row {b['position']} (run {b['run_id']}) vs reference (run {b['reference_run_id']})"
    if origin is None:
        return Text(f"{where}: no captured point differs over {b['steps']} steps", style="bold")
    layer = "" if origin["layer"] is None else f", layer {origin['layer']}"
    line = Text(f"{where}\norigin: step {origin['step']}, {origin['module']} "
                f"(op class {origin['op_class']}{layer}), max |diff| {origin['max_abs_diff']:.3g}, "
                f"{origin['max_ulp']} ULP", style="bold")
    if b["flip_step"] is not None:
        t = b["flip_tokens"]
        line.append(f"\ntoken flip: step {b['flip_step']}: reference {visible(t['reference_piece'])} vs "
                    f"{visible(t['divergent_piece'])}, reference top1-top2 margin {_hex(b['margin_at_flip'])}")
    else:
        line.append(f"\nno token flip over {b['steps']} steps")
    return line


def _modules_table(step: int, b: dict, modules: list[dict]):
    from rich.table import Table

    tags = [n for k, n in (("first_numeric_step", "first numeric divergence"), ("flip_step", "token flip"))
            if b[k] == step]
    rows = [m for m in modules if m["step"] == step and m["differs"]]
    table = Table(title=f"step {step} ({', '.join(tags)}): first differing modules, execution order")
    for col in ("layer", "module", "op class", "max abs", "max rel", "max ULP", "first diff index"):
        table.add_column(col, justify="left" if col in ("module", "op class") else "right",
                         overflow="fold" if col == "module" else "ellipsis")
    for m in rows[:TABLE_ROWS]:
        table.add_row(_dash(m["layer"]), m["module"], m["op_class"], f"{m['max_abs_diff']:.3g}",
                      f"{m['max_rel_diff']:.3g}", str(m["max_ulp"]), _dash(m["first_diff_index"]))
    table.caption = f"{len(rows)} of {sum(1 for m in modules if m['step'] == step)} points differ (bisect_modules.csv)"
    return table


def _amplification_line(amplification: list[dict], steps: list[int]) -> str:
    """'residual stream max |diff| by layer: step 0: 0 2e-06 ... | step 93: ...'."""
    parts = []
    for step in steps:
        diffs = [f"{a['max_abs_diff']:.2g}" for a in sorted(amplification, key=lambda a: a["layer"])
                 if a["step"] == step]
        parts.append(f"step {step}: " + " ".join(diffs))
    return "residual stream max |diff| by layer (amplification): " + " | ".join(parts)


def _ablation_table(entries: list[dict]):
    from rich.table import Table

    yes = {True: "yes", False: "no"}
    table = Table(title="ablation: reference and divergent condition rerun with these op classes batch-invariant")
    for col in ("op classes", "tokens match", "bit-identical", "flip step", "first differing point"):
        table.add_column(col, justify="right" if col in ("tokens match", "flip step") else "left", overflow="fold")
    for e in entries:
        first = e["first_diff"]
        where = "-" if first is None else f"step {first['step']}: {first['module']} ({first['op_class']})"
        table.add_row(" + ".join(e["ops"]), yes[e["tokens_match"]], yes[e["activations_match"]],
                      _dash(e["first_token_divergence"]), where)
    return table


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _hex(value) -> str:
    return "?" if value is None else f"{float.fromhex(value):.4g}"
