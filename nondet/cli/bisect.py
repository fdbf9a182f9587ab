"""`nondet bisect [RUN_DIR]`: where inside the model a divergence is born, and which kernel causes it."""

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app

TABLE_ROWS = 12  # differing modules shown per step; bisect_modules.csv holds them all


@app.command("bisect")
def bisect(
    ctx: typer.Context,
    run_dir: Annotated[Optional[Path], typer.Argument(
        metavar="RUN_DIR",
        help="A run directory written by `nondet probe`. Omitted: run a probe first (options below).")] = None,
    condition: Annotated[Optional[str], typer.Option(
        help="Condition to bisect, e.g. default/bs8/ends or bs8/ends. Default: the one that flips first.")] = None,
    position: Annotated[Optional[int], typer.Option(
        help="Target row of that condition (an rl run: the sequence's prompt id). Default: the first to diverge.")
    ] = None,
    max_steps: Annotated[Optional[int], typer.Option(
        help="Decode steps to replay. Default: through the probe's token flip (all steps if none).")] = None,
    ablation: Annotated[bool, typer.Option(
        "--ablation/--no-ablation", help="Rerun with batch-invariant kernels per op class (the causal test).")] = True,
    model: o.ModelOpt = None,
    prompt: o.PromptOpt = None,
    prompt_file: o.PromptFileOpt = None,
    batch_sizes: o.BatchSizesOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", help="Tokens generated per request (default 200; 64 on the trained demo model).",
        callback=o.at_least_one)] = None,
    dtype: o.DtypeOpt = "bfloat16",
    device: o.DeviceOpt = "cpu",
    attn_implementation: o.AttnOpt = None,
    trust_remote_code: o.TrustOpt = False,
    inject_variance: o.InjectOpt = None,
    threads: o.ThreadsOpt = None,
    out: o.OutOpt = None,
    json_output: o.JsonOpt = False,
) -> None:
    """Find the first (step, module, op class) where a divergent run's bits leave the reference's.

    Replays the reference (prompt alone) and one divergent condition of a probe in lockstep,
    both fed the reference's tokens, with hooks on every module capturing the target row
    only. Prints the first difference and, when it was absorbed (transient), the origin of
    the lasting divergence (the first one to enter the KV cache, or the one at the flip),
    their differing modules, and the kernel ablation: the divergent condition rerun with
    batch-invariant kernels for one op class at a time.
    A speculative condition (`nondet probe --speculative`) is replayed as one-token decoding
    vs the verification rounds its stream recorded (k+1 rows per forward), teacher-forced,
    comparing each logical position's activations.
    An rl run (`nondet rl`) is replayed as the sampler's decode (KV cache, its batch) vs the
    trainer's teacher-forced prefill of the same sequence in its micro-batch; step s is the
    position whose logits give sampled token s. --condition names a trainer condition.
    Writes bisect.json, bisect_modules.csv and ablation.json into the run directory.

    With RUN_DIR, the probe's own model, prompt and settings are replayed: the options of the
    probe run first (--model, --prompt, -b, -n, --dtype, ...) are refused. The run directory is
    checked (finished, writable, every record readable) before the model loads.

    Exit codes:
      0  bisected (the result is printed and written into the run directory)
      2  usage error (a flag, or a flag that does not apply with RUN_DIR)
      3  could not run: the model missing or not loadable, out of memory,
         or a tensor-parallel worker died (--tp runs)
      4  bad run directory: missing, a file, unfinished, malformed,
         read-only, or with no divergent condition;
         also a result that could not be saved (printed first)
      70 internal error (a bug: NONDET_DEBUG=1 shows the traceback)
      130 interrupted (Ctrl-C: the run directory keeps what was written)

    Example:  nondet bisect nondet-runs/20261122-031500-probe --condition bs8/ends
              nondet bisect RUN_DIR --condition spec/self4
              nondet bisect RL_RUN_DIR --condition trainer/mb4/right
    """
    from nondet.errors import RunDirError, UsageError
    from nondet.probes.bisect import BisectConfig
    from nondet.probes.bisect.bisect import ResultNotSaved
    from nondet.probes.bisect.inputs import check_inputs, check_run_dir

    if max_steps is not None and max_steps < 1:
        raise UsageError("--max-steps must be >= 1")
    if run_dir is not None:
        _refuse_probe_options(ctx, model, prompt, prompt_file, out)
        check_run_dir(run_dir)  # before any work: finished, writable, config.json whole
    if run_dir is None:
        run_dir = _probe_first(prompt, prompt_file, json_output, model=model, dtype=dtype, device=device,
                               attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
                               inject_variance=inject_variance, batch_sizes=batch_sizes,
                               max_new_tokens=max_new_tokens, threads=threads, out=out)
    config = BisectConfig(str(run_dir), condition, position, max_steps, ablation)
    run = _replay_of(config.run_dir)
    check_inputs(config, chooses=_chooses(run))  # every record, before the model loads
    try:
        result = _run_with_status(run, config, quiet=json_output)
    except ResultNotSaved as exc:  # minutes of replay: shown, even where they cannot be kept
        _show(exc.result, json_output)
        raise RunDirError(f"{exc}; the result above was not saved") from exc
    _show(result, json_output)
    from nondet.cli.probe import write_report_if_available

    write_report_if_available(result.run_dir)


def _show(result, json_output: bool) -> None:
    if json_output:
        print(json.dumps({"run_dir": str(result.run_dir), **result.bisect}, indent=1))
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:  # piped or logged, no width asked for: the
        console = Console(width=140)  # wide tables whole, not their 80-column form (COLUMNS=80 gives that)
    print_bisect(result.bisect, result.modules, console)
    print_partial(result.run_dir, console)
    console.print(f"run directory: {result.run_dir}")
    console.print(f"wall time: {result.seconds:.1f} s")


# options that shape the probe run first without RUN_DIR; with it, the probe's own settings are replayed
PROBE_SETTINGS = ("batch_sizes", "max_new_tokens", "dtype", "device", "attn_implementation", "trust_remote_code",
                  "inject_variance", "threads")


def _refuse_probe_options(ctx: typer.Context, model, prompt, prompt_file, out) -> None:
    """With RUN_DIR, an option of the probe run first would be ignored: refused instead, by name. Given is
    what click did not take from the default (--dtype bfloat16 typed out counts as given too)."""
    from nondet.errors import UsageError

    if any(v is not None for v in (model, prompt, prompt_file, out)):
        raise UsageError("--model, --prompt, --prompt-file and --out apply only without RUN_DIR "
                         "(bisect reloads the probe's model and prompt from RUN_DIR/config.json)")
    given = [p.opts[0] for p in ctx.command.params if p.name in PROBE_SETTINGS and _given(ctx, p.name)]
    if given:
        names = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
        raise UsageError(f"{names} {'applies' if len(given) == 1 else 'apply'} only without RUN_DIR (bisect "
                         "replays the probe with its own settings, from RUN_DIR/config.json)")


def _probe_first(prompt, prompt_file, quiet: bool, *, model, batch_sizes, max_new_tokens, **options) -> Path:
    """No RUN_DIR: run the probe (same options and defaults as `nondet probe` with one prompt; on the
    trained demo model, its questions) to find a divergent condition."""
    from nondet.cli.options import read_prompt
    from nondet.cli.probe import run_with_progress
    from nondet.cli.probe_config import build_probe_config, check_context, demo_defaults
    from nondet.probes.probe import DEFAULT_PROMPT

    targets, chat = (read_prompt(prompt, prompt_file, DEFAULT_PROMPT),), False
    if model is None and prompt is None and prompt_file is None:
        targets, chat, batch_sizes, max_new_tokens = demo_defaults(targets, chat, batch_sizes, max_new_tokens)
    config = build_probe_config("bisect", targets, model=model, batch_sizes=batch_sizes,
                                max_new_tokens=max_new_tokens or 200, chat=chat, **options)
    check_context(config)
    result = run_with_progress(config, quiet=quiet)
    if not quiet:
        from rich.console import Console

        Console().print(f"probe: {result.summary['verdict']} ({result.seconds:.1f} s)")
    return result.run_dir


def _given(ctx: typer.Context, name: str) -> bool:
    # by the source's name: typer vendors its own click, whose ParameterSource is not click's
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _replay_of(run_dir: str):
    """The bisect of the run directory's kind: an rl run's sampler vs trainer, a --tp run's replay on a worker
    group at the condition's degree, else a probe run's static batch or speculative rounds."""
    from nondet.probes.bisect_probe import run_bisect
    from nondet.probes.rl.bisect import is_rl_run, run_rl_bisect
    from nondet.probes.tp.bisect import is_tensor_parallel, run_tp_bisect

    if is_rl_run(run_dir):
        return run_rl_bisect
    return run_tp_bisect if is_tensor_parallel(run_dir) else run_bisect


def _chooses(run) -> bool:
    """Does this bisect pick its target with probes/bisect/choose.py (a probe run's)?"""
    from nondet.probes.bisect_probe import run_bisect

    return run is run_bisect


def _run_with_status(run, config, quiet: bool):
    """run(config) with a status line on stderr naming the stage (none with --json)."""
    from rich.console import Console

    if quiet:
        return run(config)
    with Console(stderr=True).status("bisect") as status:
        return run(config, lambda text: status.update(f"bisect: {text}"))


def print_partial(run_dir, console) -> None:
    """A bisect over a run directory a crash tore: it chose its condition from the records before the tear."""
    from nondet.rundir import RunDir
    from nondet.rundir.reader import torn_records

    partial = torn_records(RunDir(run_dir))
    if partial:
        console.print(f"partial: {partial}; the condition was chosen from the records before it",
                      style="yellow", markup=False, highlight=False)


def print_bisect(b: dict, modules: list[dict], console) -> None:
    from functools import partial

    from rich.text import Text

    from nondet.cli.fit import fitted
    from nondet.verdict import replay_line, routing_line

    if "routing" in b:  # a mixture of experts: did the tokens go to other experts? (before any op detail)
        console.print(Text(routing_line(b["routing"], b["steps"]), style="bold"))
    console.print(_origin_line(b))
    if b.get("rl"):
        console.print(_rl_line(b["rl"]))
    replayed = replay_line(b)
    if replayed:
        console.print(f"warning: {replayed}", style="yellow")
    steps = _table_steps(b)
    for step in steps:
        console.print(fitted(console, partial(_modules_table, step, b, modules),
                             partial(_modules_table, step, b, modules, narrow=True)))
    if steps and b["amplification"]:
        console.print(_amplification_line(b["amplification"], steps))
    if b.get("ablation"):
        console.print(fitted(console, partial(_ablation_table, b["ablation"]),
                             partial(_ablation_table, b["ablation"], narrow=True)))
        minimal = b.get("minimal_set")
        console.print(Text("minimal set that removes the divergence: "
                           + (" + ".join(minimal) if minimal else "none found"), style="bold"))
        if b.get("rl"):
            equal = [" + ".join(e["ops"]) for e in b["ablation"] if e.get("logprobs_match")]
            console.print("every logprob bit-identical (KL exactly 0) with batch-invariant: "
                          + (", ".join(equal) if equal else "none of these"))
    elif b["origin"] is not None:
        console.print("ablation: not run (--no-ablation, or a batch-invariant condition)")


def _rl_line(rl: dict) -> str:
    """Which two computations an rl bisect compared (bisect.json "rl")."""
    first = rl["first_logprob_step"]
    return (f"rl: sequence {rl['sequence']}: sampler decode (batch {rl['sampler_batch']}, row {rl['sampler_row']}) vs "
            f"trainer prefill (micro-batch {rl['micro_batch']}, {rl['padding']}); step s = the position giving "
            f"sampled token s; logprobs " + (f"first differ at token {first}" if first is not None else
                                             f"bit-identical over {rl['tokens']} tokens"))


def _table_steps(b: dict) -> list[int]:
    """Steps with a module table: the first difference, the lasting divergence, the flip."""
    lasting = (b.get("lasting") or {}).get("step")
    return list(dict.fromkeys(s for s in (b["first_numeric_step"], lasting, b["flip_step"]) if s is not None))


def _origin_line(b: dict):
    from rich.text import Text

    from nondet.cli.render import visible
    from nondet.fmt import fmt_hex_value

    origin, lasting = b["origin"], b.get("lasting")
    where = f"{b['condition_id']} row {b['position']} (run {b['run_id']}) vs reference (run {b['reference_run_id']})"
    if origin is None:
        return Text(f"{where}: no captured point differs over {b['steps']} steps", style="bold")
    line = Text(where)
    if "lasting" not in b:  # bisect.json written before lasting divergences were told apart
        line.append(f"\norigin: {_point(origin)}", style="bold")
    elif lasting is not None and _same(origin, lasting):
        line.append(f"\norigin: {_point(origin)}; lasting: {_via(lasting)}", style="bold")
    else:
        line.append(f"\nfirst difference: {_point(origin)}; {_transient(origin, lasting, b['transients'])}")
        line.append(_transients_part(b["transients"]))
        line.append(f"\nlasting origin: {_point(lasting)}; {_via(lasting)}" if lasting is not None else
                    f"\nno lasting divergence over {b['steps']} steps: no difference reached the KV cache "
                    "or flipped a token", style="bold")
    if b["flip_step"] is not None:
        t = b["flip_tokens"]
        line.append(f"\ntoken flip: step {b['flip_step']}: reference {visible(t['reference_piece'])} vs "
                    f"{visible(t['divergent_piece'])}, reference top1-top2 margin {fmt_hex_value(b['margin_at_flip'])}")
    else:
        line.append(f"\nno token flip over {b['steps']} steps")
    agreement = b.get("numeric_agreement")
    if agreement and not agreement["agree"]:
        line.append(f"\nprobe vs bisect: {agreement['note']}")
    return line


def _point(p: dict) -> str:
    """'step 3, model.layers.1.mlp.down_proj (op class matmul, layer 1), max |diff| 7.6e-06, 1 ULP'."""
    layer = "" if p["layer"] is None else f", layer {p['layer']}"
    return (f"step {p['step']}, {p['module']} (op class {p['op_class']}{layer}), "
            f"max |diff| {p['max_abs_diff']:.3g}, {p['max_ulp']} ULP")


def _same(a: dict, b: dict) -> bool:
    return (a["step"], a["module"], a["order"]) == (b["step"], b["module"], b["order"])


def _via(lasting: dict) -> str:
    if lasting["via"] == "kv cache":
        silent = lasting.get("silent_steps") or 0
        return (f"enters the KV cache at {lasting['enters_at']}"
                + (f" (its effect rounded away at {silent} later step(s))" if silent else ""))
    return "born at the flip step, it reached the logits directly"


REACH = {"layer": "absorbed before the residual stream", "residual stream": "reached the residual stream, "
         "absorbed before the KV cache and the logits", "logits": "reached the logits, not the KV cache"}


def _transient(origin: dict, lasting: dict | None, transients: list[dict]) -> str:
    """Why the first difference is not the lasting one."""
    if transients and transients[0]["step"] == origin["step"]:
        return "transient: " + REACH.get(transients[0]["reach"], transients[0]["reach"])
    return "absorbed within its step, before the lasting divergence born later in the same step"


def _transients_part(transients: list[dict], shown: int = 4) -> str:
    """'' or '\nother transient differences: step 7 (model...down_proj, matmul), ... (9 in all)'."""
    rest = transients[1:]
    if not rest:
        return ""
    parts = [f"step {t['step']} ({t['module']}, {t['op_class']})" for t in rest[:shown]]
    more = f" ... ({len(transients)} transient steps in all)" if len(rest) > shown else ""
    return "\nother transient differences: " + ", ".join(parts) + more


def _modules_table(step: int, b: dict, modules: list[dict], narrow: bool = False):
    """narrow: the module whole, its op class, max abs and max ULP; the layer (in the module's path),
    max rel and first diff index are in bisect_modules.csv."""
    from rich.table import Table

    lasting = b.get("lasting") or {}
    tags = [n for s, n in ((b["first_numeric_step"], "first difference"), (lasting.get("step"), "lasting divergence"),
                           (b["flip_step"], "token flip")) if s == step]
    rows = [m for m in modules if m["step"] == step and m["differs"]]
    table = Table(title=f"step {step} ({', '.join(tags)}): first differing modules, execution order")
    columns = NARROW_MODULE_COLUMNS if narrow else MODULE_COLUMNS
    for col in columns:
        table.add_column(col, justify="left" if col in ("module", "op class") else "right",
                         overflow="fold" if col == "module" else "ellipsis")
    for m in rows[:TABLE_ROWS]:
        origin = lasting.get("step") == step and lasting.get("order") == m["order"]
        cells = {"layer": _dash(m["layer"]), "module": m["module"] + (" <- lasting origin" if origin else ""),
                 "op class": m["op_class"], "max abs": f"{m['max_abs_diff']:.3g}",
                 "max rel": f"{m['max_rel_diff']:.3g}", "max ULP": str(m["max_ulp"]),
                 "first diff index": _dash(m["first_diff_index"])}
        table.add_row(*(cells[col] for col in columns), style="bold" if origin else None)
    differ = f"{len(rows)} of {sum(1 for m in modules if m['step'] == step)} points differ"
    table.caption = f"{differ}; every column: bisect_modules.csv" if narrow else f"{differ} (bisect_modules.csv)"
    return table


MODULE_COLUMNS = ("layer", "module", "op class", "max abs", "max rel", "max ULP", "first diff index")
NARROW_MODULE_COLUMNS = ("module", "op class", "max abs", "max ULP")


def _amplification_line(amplification: list[dict], steps: list[int]) -> str:
    """'residual stream max |diff| by layer: step 0: 0 2e-06 ... | step 93: ...'."""
    parts = []
    for step in steps:
        diffs = [f"{a['max_abs_diff']:.2g}" for a in sorted(amplification, key=lambda a: a["layer"])
                 if a["step"] == step]
        parts.append(f"step {step}: " + " ".join(diffs))
    return "residual stream max |diff| by layer (amplification): " + " | ".join(parts)


def _ablation_table(entries: list[dict], narrow: bool = False):
    """narrow: short headers and a legend; the first differing point and the lasting origin in one column."""
    from rich.table import Table

    yes = {True: "yes", False: "no"}
    table = Table(title="ablation: reference and divergent condition rerun with these op classes batch-invariant")
    columns = ("op classes", "tokens", "bits", "flip", "first differing point") if narrow else \
        ("op classes", "tokens match", "bit-identical", "flip step", "first differing point", "lasting origin")
    for col in columns:
        table.add_column(col, justify="right" if col in ("tokens match", "flip step", "tokens", "flip") else "left",
                         overflow="fold")
    if narrow:  # one op class a line ("attention +"), leaving the width to the module paths
        table.columns[0].max_width = max((len(op) for e in entries for op in e["ops"]), default=8) + 2
        table.min_width = max(map(len, ABLATION_LEGEND.splitlines()))
    for e in entries:
        places = (_first_and_lasting(e["first_diff"], e.get("lasting")),) if narrow else \
            (_where(e["first_diff"]), _where(e.get("lasting")))
        table.add_row(" + ".join(e["ops"]), yes[e["tokens_match"]], yes[e["activations_match"]],
                      _dash(e["first_token_divergence"]), *places)
    if narrow:
        table.caption = ABLATION_LEGEND
    return table


# under the narrow ablation table (each line under 80 columns)
ABLATION_LEGEND = ("tokens: tokens match the reference; bits: every activation bit-identical\n"
                   "flip: token flip step; lasting: where the lasting divergence is born")


def _first_and_lasting(first: dict | None, lasting: dict | None) -> str:
    """The first differing point, then 'lasting: same', 'lasting: -' or the lasting origin."""
    if first is None:
        return "-"
    same = lasting is not None and (lasting["step"], lasting["module"]) == (first["step"], first["module"])
    return f"{_where(first)}\nlasting: {'same' if same else _where(lasting)}"


def _where(point: dict | None) -> str:
    return "-" if point is None else f"step {point['step']}: {point['module']} ({point['op_class']})"


def _dash(value) -> str:
    return "-" if value is None else str(value)


