"""`nondet gate`: run the probe under a policy and exit 0 (met) or 1 (violated), for CI."""

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app

if TYPE_CHECKING:
    from nondet.reports.ci import Verdict
    from nondet.reports.ci.config import GateSettings

@dataclass(frozen=True)
class GateOutputs:
    out: str | None  # run directory (one per prompt below it when there are several)
    junit: str | None  # JUnit XML path, or None
    bisect: bool  # bisect the first failing condition (when nondet bisect is installed)
    argv: tuple[str, ...]  # the command line, recorded in config.json for "reproduce"


@dataclass
class Gated:
    run_dir: Path
    summary: dict
    verdict: "Verdict"


@app.command("gate")
def gate(
    model: Annotated[Optional[str], typer.Argument(
        help="Hugging Face causal LM: local directory or hub id. Default: \\[tool.nondet] model, else the embedded demo model.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="Config file (nondet.toml, or a pyproject.toml with \\[tool.nondet]). Default: found from the working directory up.")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option(
        "--prompt", "-p", help="Target prompt; repeat for several (each is its own probe).")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", "-b", help="Batch sizes, e.g. 1,8,16 (default 1,8,16).")] = None,
    positions: Annotated[Optional[str], typer.Option(help="Target rows per batch: ends | first | last | all.")] = None,
    runs: Annotated[Optional[int], typer.Option(help="Spread N target replays over the batches.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", "-n", help="Tokens per request (default 120).")] = None,
    kernels: Annotated[Optional[str], typer.Option(help="default | batch-invariant.")] = None,
    require: Annotated[Optional[str], typer.Option(
        help="Requirement: 'identical' (default) or 'NAME = VALUE' with a name below.")] = None,
    max_distinct: Annotated[Optional[int], typer.Option(help="Allow at most N distinct completions.")] = None,
    min_divergence_step: Annotated[Optional[int], typer.Option(help="Allow token divergence only from step S on.")] = None,
    max_logprob_diff: Annotated[Optional[float], typer.Option(
        help="Same tokens, chosen-token logprobs within X of the reference.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="bfloat16 | float16 | float32.")] = None,
    device: Annotated[Optional[str], typer.Option(help="torch device, e.g. cpu or cuda:0.")] = None,
    threads: o.ThreadsOpt = None,
    load: Annotated[Optional[str], typer.Option(
        "--load", help="static (batched generate) | continuous (continuous batching in process).")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        help="Probe a live OpenAI-compatible server at this base URL; MODEL names the served model.")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Filler arrival rate under load (see nondet probe).")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="Fillers in the engine / copies in flight.")] = None,
    inject_variance: Annotated[Optional[bool], typer.Option(
        "--inject-variance", help="Self-test: make one RMSNorm batch-variant on purpose; the gate must then fail.")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Write JUnit XML here (one test case per condition).")] = None,
    bisect: Annotated[bool, typer.Option("--bisect/--no-bisect", help="Bisect the first failing condition.")] = True,
    out: o.OutOpt = None,
) -> None:
    r"""Fail CI when a model's answers depend on the batch: a probe under a policy.

    Probes each prompt (settings: flags, else \[tool.nondet] in the repository's
    pyproject.toml or a nondet.toml, else defaults) and checks every condition
    against the prompt alone at batch size 1. The requirement is ONE of:
    identical (default: same tokens, bit-identical logprobs), --max-distinct N,
    --min-divergence-step S or --max-logprob-diff X. The first failing
    condition is bisected up to the step where its bits first differ
    (--no-bisect skips it). Writes the run directory and report;
    --junit FILE writes JUnit XML, one test case per condition; under GitHub
    Actions it prints ::error annotations and appends a Markdown summary, with
    the bisect result, to $GITHUB_STEP_SUMMARY (a summary that cannot be
    written is a warning, never a failed gate).

    Exit codes:
      0  policy met
      1  policy violated (never 0 on a violation)
      2  usage or configuration error (flag, nondet.toml, \[tool.nondet])
      3  could not run: model missing or not loadable, out of memory,
         server unreachable (--endpoint)

    Examples:
      nondet gate --junit junit.xml             # demo model: exits 1
      nondet gate --kernels batch-invariant     # nondet's kernels: exits 0
      nondet gate ./my-model -b 1,8 --max-distinct 2
    """
    from nondet.reports.ci.config import find_config, load_config, resolve

    flags = {"model": model, "prompts": prompt or None, "batch-sizes": batch_sizes, "positions": positions,
             "runs": runs, "max-new-tokens": max_new_tokens, "kernels": kernels, "require": require,
             "max-distinct": max_distinct, "min-divergence-step": min_divergence_step,
             "max-logprob-diff": max_logprob_diff, "dtype": dtype, "device": device, "threads": threads,
             "load": load, "endpoint": endpoint, "rate": rate, "concurrency": concurrency,
             "inject-variance": inject_variance}
    source = config if config is not None else find_config(Path.cwd())
    settings = resolve(flags, load_config(source) if source else {}, source)
    outputs = GateOutputs(str(out) if out else None, str(junit) if junit else None, bisect,
                          tuple(["nondet"] + sys.argv[1:]))
    passed = run_gate(settings, outputs)
    sys.exit(0 if passed else 1)  # sys.exit, not typer.Exit: standalone_mode=False would swallow it


def run_gate(settings: "GateSettings", outputs: GateOutputs) -> bool:
    """Probe every prompt, judge, write the CI outputs, bisect, report; True when the policy is met."""
    from nondet.reports.ci import github
    from nondet.reports.ci.junit import write_junit

    started = time.perf_counter()
    gated = [_gate_one(settings, p, d, outputs) for p, d in _prompt_dirs(settings, outputs.out)]
    verdicts = [g.verdict for g in gated]
    if outputs.junit:
        write_junit(outputs.junit, verdicts, time.perf_counter() - started)
    github.annotate(verdicts)
    _print(gated, outputs)
    bisects = []
    for g in gated:  # diagnostics: they never change the verdict or the exit code
        bisect = outputs.bisect and not g.verdict.passed
        bisects.append(_diagnose("bisect", _bisect_if_available, g.run_dir, g.verdict) if bisect else None)
        _diagnose("report", _write_report, g.run_dir)
    _step_summary(verdicts, bisects)
    return all(v.passed for v in verdicts)


def _diagnose(what: str, step, *args) -> str | None:
    """Run a diagnostic step; its one-line error is a warning, so exit 1 keeps meaning 'violated'.
    Returns the step's one-line result, or the warning."""
    from nondet.errors import NondetError

    try:
        return step(*args)
    except NondetError as exc:
        warning = f"{what} failed: {exc}"
        print(f"nondet: warning: {warning}", file=sys.stderr)
        return warning


def _step_summary(verdicts, bisects: list[str | None]) -> None:
    """The GitHub step summary, last (it holds the bisect result). A summary that cannot be written
    is a warning: the verdict, the JUnit file and the annotations stand."""
    import os

    from nondet.reports.ci import github

    try:
        github.append_step_summary(verdicts, bisects=bisects)
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        print(f"nondet: warning: cannot write the GitHub step summary to {os.environ.get('GITHUB_STEP_SUMMARY')}: "
              f"{reason}; the gate's verdict stands", file=sys.stderr)


def _prompt_dirs(settings, out: str | None) -> list[tuple[str | None, str]]:
    """(prompt, run directory) pairs: the run directory itself, or prompt-N below it."""
    from nondet.probes.probe import default_run_dir

    base = out or default_run_dir("gate")
    prompts = settings.prompts or (None,)
    if len(prompts) == 1:
        return [(prompts[0], base)]
    return [(p, str(Path(base) / f"prompt-{i}")) for i, p in enumerate(prompts, start=1)]


def _gate_one(settings, prompt: str | None, run_dir: str, outputs: GateOutputs) -> Gated:
    from nondet.cli.probe import run_with_progress
    from nondet.reports.ci import evaluate
    from nondet.rundir import RunDir

    config = _probe_config(settings, prompt, run_dir, outputs.argv)
    result = run_with_progress(config, quiet=not sys.stderr.isatty())  # no bar in CI logs
    streams = RunDir(result.run_dir).read_jsonl("streams.jsonl")
    name = f"prompt {config.prompt[:60]!r}" if len(settings.prompts) > 1 else ""
    verdict = evaluate(result.summary, streams, settings.policy, name=name, run_dir=str(result.run_dir))
    RunDir(result.run_dir).write_json("gate.json", verdict_json(verdict))  # the report shows it
    return Gated(result.run_dir, result.summary, verdict)


def verdict_json(verdict) -> dict:
    """gate.json: the policy, pass/fail and each condition's result (docs/run-directory.md)."""
    import dataclasses

    return dataclasses.asdict(verdict)


def _probe_config(settings, prompt: str | None, run_dir: str, argv: tuple[str, ...]):
    from nondet.probes.load.config import LoadConfig
    from nondet.probes.loading import ModelSpec
    from nondet.probes.probe import DEFAULT_PROMPT, ProbeConfig

    load = LoadConfig(mode="server" if settings.endpoint else settings.load, rate=settings.rate,
                      concurrency=settings.concurrency, endpoint=settings.endpoint)
    return ProbeConfig(
        prompt=prompt or DEFAULT_PROMPT,
        model=ModelSpec(settings.model, settings.dtype, settings.device, inject_variance=settings.inject_variance),
        batch_sizes=settings.batch_sizes, placement=settings.positions, runs=settings.runs,
        max_new_tokens=settings.max_new_tokens, kernels=(settings.kernels,),
        threads=settings.threads, out=run_dir, argv=argv, load=load,
    )


def _bisect_if_available(run_dir: Path, verdict: "Verdict") -> None:
    """`nondet bisect` on the first failing condition; skipped when it is not installed."""
    try:
        from nondet.probes.bisect import BisectConfig, run_bisect
    except ImportError:
        return
    first = verdict.failures[0]
    # Up to the step where the bits first differ: where the difference is born and which op
    # class causes it, in seconds; `nondet bisect RUN_DIR` replays on through the token flip.
    born = first.first_numeric_divergence if first.first_numeric_divergence is not None else first.first_token_divergence
    config = BisectConfig(run_dir=str(run_dir), condition=first.condition_id,
                          max_steps=None if born is None else born + 1)
    result = run_bisect(config)
    line = _bisect_line(result.bisect, first.first_numeric_divergence)
    print(f"bisect: {line} (bisect.json in {run_dir})", flush=True)
    return line


def _bisect_line(bisect: dict, logprob_step: int | None = None) -> str:
    """Where the bits are born (any activation), and how that relates to the table's number (the logprob)."""
    origin, lasting = bisect.get("origin"), bisect.get("lasting")
    if not origin:
        return "no captured module differs"
    where = f"first differing activation bits at {_point(origin)}"
    if "lasting" in bisect and (lasting is None or _point(lasting) != _point(origin)):
        where += f", transient; lasting divergence from {_point(lasting)}" if lasting else ", transient"
    if logprob_step is not None and logprob_step != origin["step"]:
        why = ("where the lasting divergence begins" if lasting and lasting["step"] == logprob_step else
               "which no earlier activation difference had reached")
        where += (f"; the sampled token's logprob bits first differ at step {logprob_step} (the table's first "
                  f"numeric divergence), {why}")
    minimal = bisect.get("minimal_set")
    return where + (f"; batch-invariant {' + '.join(minimal)} removes it" if minimal else "")


def _point(p: dict) -> str:
    return f"step {p['step']} in {p['module']} ({p['op_class']})"


def _write_report(run_dir: Path) -> None:
    from nondet.cli.probe import write_report_if_available

    write_report_if_available(run_dir)


def _print(gated: list[Gated], outputs: GateOutputs) -> None:
    from rich.console import Console
    from rich.text import Text

    from nondet.cli.render import print_probe_summary

    console = Console()
    for g in gated:
        print_probe_summary(g.summary, g.run_dir, console)
        for c in g.verdict.conditions:  # Text, not markup: model text may hold [brackets]
            mark = Text("PASS ", style="green") if c.passed else Text("FAIL ", style="bold red")
            console.print(mark + Text(c.condition_id + (f": {c.message}" if c.message else "")), soft_wrap=True)
        console.print(Text(f"nondet gate: {g.verdict.message}", style="bold"), soft_wrap=True)
    if outputs.junit:
        console.print(Text(f"junit: {outputs.junit}"), soft_wrap=True)
