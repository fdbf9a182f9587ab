"""`nondet bisect [RUN_DIR]`: where inside the model a divergence is born, and which kernel causes it."""

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app


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
      0  bisected (the result is printed and written into the run directory), or nothing
         to bisect: every run of the probe matched its reference (said in one line)
      2  usage error (a flag, or a flag that does not apply with RUN_DIR)
      3  could not run: the model missing or not loadable, out of memory,
         or a tensor-parallel worker died (--tp runs)
      4  bad run directory: missing, a file, unfinished, malformed or read-only;
         also a result that could not be saved (printed first)
      70 internal error (a bug: NONDET_DEBUG=1 shows the traceback)
      130 interrupted (Ctrl-C: the run directory keeps what was written)

    Example:  nondet bisect nondet-runs/20261122-031500-probe --condition bs8/ends
              nondet bisect RUN_DIR --condition spec/self4
              nondet bisect RL_RUN_DIR --condition trainer/mb4/right
    """
    from nondet.errors import NothingToBisect, RunDirError, UsageError
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
    try:
        check_inputs(config, chooses=_chooses(run))  # every record, before the model loads
        result = _run_with_status(run, config, quiet=json_output)
    except NothingToBisect as exc:  # an invariant run: its verdict, not an error
        _show_nothing(str(exc), json_output)
        return
    except ResultNotSaved as exc:  # minutes of replay: shown, even where they cannot be kept
        _show(exc.result, json_output)
        raise RunDirError(f"{exc}; the result above was not saved") from exc
    _show(result, json_output)
    from nondet.cli.probe import write_report_if_available

    write_report_if_available(result.run_dir)


def _show_nothing(reason: str, json_output: bool) -> None:
    """The one line of a probe run with no divergence (stdout, or a JSON object with --json)."""
    if json_output:
        import json

        print(json.dumps({"bisected": False, "reason": reason}))
    else:
        print(f"nothing to bisect: {reason}")


def _show(result, json_output: bool) -> None:
    if json_output:
        print(json.dumps({"run_dir": str(result.run_dir), **result.bisect}, indent=1))
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:  # piped or logged, no width asked for: the
        console = Console(width=140)  # wide tables whole, not their 80-column form (COLUMNS=80 gives that)
    from nondet.cli.render_bisect import print_bisect, print_partial

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
