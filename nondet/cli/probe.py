"""`nondet probe`: replay a prompt under many batch conditions and diff the token streams."""

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app


@app.command("probe")
def probe(
    model: o.ModelOpt = None,
    prompt: o.PromptOpt = None,
    prompt_file: o.PromptFileOpt = None,
    batch_sizes: o.BatchSizesOpt = "1,2,4,8,16",
    positions: Annotated[str, typer.Option(
        help="Target rows in each batch: ends (first and last) | first | last | all (every row a copy).")] = "ends",
    runs: Annotated[Optional[int], typer.Option(
        help="Spread N target replays over the batches (overrides --positions).")] = None,
    fillers: Annotated[Optional[Path], typer.Option(
        help="File of filler prompts, one per line (default: a built-in multilingual set).")] = None,
    ragged: Annotated[bool, typer.Option(
        "--ragged", help="Also run left-padded batches of unequal lengths (a separate, labelled condition).")] = False,
    max_new_tokens: o.MaxNewTokensOpt = 200,
    temperature: Annotated[float, typer.Option(help="0 = greedy. >0 samples; each request has its own seeded generator.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of each request's generator when sampling.")] = 0,
    kernels: o.KernelsOpt = "default",
    confirm: Annotated[bool, typer.Option(
        "--confirm", help="Run default kernels, then batch-invariant ones, and compare.")] = False,
    dtype: o.DtypeOpt = "bfloat16",
    device: o.DeviceOpt = "cpu",
    attn_implementation: o.AttnOpt = None,
    trust_remote_code: o.TrustOpt = False,
    threads: o.ThreadsOpt = None,
    out: o.OutOpt = None,
    json_output: o.JsonOpt = False,
) -> None:
    """Replay one prompt under varying batch sizes and positions; find where outputs diverge.

    The reference is the prompt alone at batch size 1. Every run is diffed against it: the
    first step whose token differs, the first step whose logprob bits differ, the distinct
    completions, and the branch points.

    Example:  nondet probe --batch-sizes 1,2,4,8,16 --max-new-tokens 200
    """
    import sys

    from nondet.cli.options import read_lines_file, read_prompt
    from nondet.probes.conditions import parse_batch_sizes
    from nondet.probes.corpus import FILLERS
    from nondet.probes.loading import ModelSpec
    from nondet.probes.probe import DEFAULT_PROMPT, ProbeConfig

    config = ProbeConfig(
        prompt=read_prompt(prompt, prompt_file, DEFAULT_PROMPT),
        model=ModelSpec(model, dtype, device, attn_implementation, trust_remote_code),
        batch_sizes=parse_batch_sizes(batch_sizes),
        placement=positions, runs=runs,
        fillers=read_lines_file(fillers, "fillers") if fillers else FILLERS,
        ragged=ragged, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        kernels=("default", "batch-invariant") if confirm else (kernels,),
        threads=threads, out=str(out) if out else None, argv=tuple(["nondet"] + sys.argv[1:]),
    )
    result = run_with_progress(config, quiet=json_output)
    write_report_if_available(result.run_dir)
    if json_output:
        print(json.dumps({"run_dir": str(result.run_dir), "seconds": round(result.seconds, 2),
                          **result.summary}, indent=1))
        return
    from rich.console import Console

    from nondet.cli.render import print_probe_summary

    console = Console()
    print_probe_summary(result.summary, result.run_dir, console)
    console.print(f"wall time: {result.seconds:.1f} s")


def run_with_progress(config, quiet: bool):
    """run_probe with a rich progress bar on stderr (none with --json)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nondet.probes.probe import run_probe

    if quiet:
        return run_probe(config)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("loading model", total=None)

        def on_condition(condition, index, total):
            progress.update(task, total=total, completed=index, description=f"{condition.kernels} {condition.label}")

        result = run_probe(config, on_condition)
        progress.update(task, completed=progress.tasks[0].total or 0)
    return result


def write_report_if_available(run_dir) -> None:
    """Reports are written at the end of every stage that changes the run directory."""
    try:
        from nondet.reports import write_report
    except ImportError:
        return
    write_report(run_dir)
