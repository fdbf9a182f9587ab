"""`nondet gate`: run the probe under a policy and exit 0 (met) or 1 (violated), for CI.

The gate itself is the library nondet.gate; this module parses, builds the probe configs,
and shows the run (progress bar, tables, bisect line, warnings).
"""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app
from nondet.cli.deprecated_model import HiddenArgumentsCommand, ModelArg, model_of

if TYPE_CHECKING:
    from nondet.gate.config import GateSettings
    from nondet.gate.run import Gated, GateHooks, GateTarget
    from nondet.probes.probe import ProbeConfig
    from nondet.rl.config import RLConfig


@app.command("gate", cls=HiddenArgumentsCommand)
def gate(
    model_arg: ModelArg = None,
    model: o.ModelOpt = None,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="Config file (nondet.toml, or a pyproject.toml with \\[tool.nondet]). Default: found from the working directory up.")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option(
        "--prompt", "-p", help="Target prompt; repeat for several (each is its own probe).")] = None,
    prompts_file: Annotated[Optional[Path], typer.Option(
        "--prompts", help="File of target prompts, the format of nondet probe --prompts: JSONL (a JSON string or "
                          "{\"prompt\": ...} a line, so a prompt may hold newlines, or {\"messages\": [...]}: a "
                          "chat, sent through the chat template) or plain text, one prompt a line.")
    ] = None,
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", "-b", help="Batch sizes, e.g. 1,8,16 (default 1,8,16).")] = None,
    positions: Annotated[Optional[str], typer.Option(help="Target rows per batch: auto (every row a target with several prompts, else ends) | rows | padded | ends | first | last | all.")] = None,
    runs: Annotated[Optional[int], typer.Option(help="Spread N target replays over the batches.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", "-n", help="Tokens per request (default 120).")] = None,
    kernels: Annotated[Optional[str], typer.Option(help="default | batch-invariant.")] = None,
    require: Annotated[Optional[str], typer.Option(
        help="Requirement: 'identical' (default) or 'NAME = VALUE' with a name below.")] = None,
    max_distinct: Annotated[Optional[int], typer.Option(help="Allow at most N distinct completions.")] = None,
    min_divergence_step: Annotated[Optional[int], typer.Option(help="Allow token divergence only from step S on.")] = None,
    max_logprob_diff: Annotated[Optional[float], typer.Option(
        help="Same tokens, chosen-token logprobs within X of the reference.")] = None,
    max_flip_rate: Annotated[Optional[float], typer.Option(
        help="The 95% upper bound of the rate of runs whose tokens flip, below P (0 < P < 1).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="bfloat16 | float16 | float32.")] = None,
    device: Annotated[Optional[str], typer.Option(help="torch device, e.g. cpu or cuda:0.")] = None,
    threads: o.ThreadsOpt = None,
    workers: o.WorkersOpt = None,
    load: Annotated[Optional[str], typer.Option(
        "--load", help="static (batched generate) | continuous (continuous batching in process).")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        help="Probe a live OpenAI-compatible server at this base URL; --model names the served model.")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Filler arrival rate under load (see nondet probe).")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="Fillers in the engine / copies in flight.")] = None,
    speculative: Annotated[Optional[str], typer.Option(
        "--speculative", help="Gate the speculative axis: these forms (e.g. ngram:4,self:4) vs plain greedy, "
                              "at batch size 1, under \\[tool.nondet] speculative (default identical).")] = None,
    rl: Annotated[Optional[bool], typer.Option(
        "--rl", help="Gate the rl axis: nondet rl's trainer micro-batches vs the sampler, under \\[tool.nondet] "
                     "rl / max-kl (default identical).")] = None,
    max_kl: Annotated[Optional[float], typer.Option(
        "--max-kl", help="rl axis: k3 KL(sampler || trainer) at most X per micro-batch size (implies --rl).")] = None,
    micro_batch: Annotated[Optional[str], typer.Option(
        "--micro-batch", help="rl axis: trainer micro-batch sizes (default 1,4,8).")] = None,
    sampler_batch: Annotated[Optional[int], typer.Option(
        "--sampler-batch", help="rl axis: prompts per batched sampler call (default 8).")] = None,
    inject_variance: Annotated[Optional[bool], typer.Option(
        "--inject-variance/--no-inject-variance",
        help="Self-test: make one RMSNorm batch-variant on purpose; the gate must then fail. On by default for the "
             "trained demo model only (so the demo fails on any CPU); --no-inject-variance judges this host's "
             "own kernels.")] = None,
    compile: Annotated[Optional[bool], typer.Option(
        "--compile", help="Decode on the compiled path a deployment uses (see nondet probe --compile).")] = None,
    cuda_graphs: Annotated[Optional[bool], typer.Option(
        "--cuda-graphs", help="Batch axis: decode with the eager kernels replayed from CUDA graphs, CUDA only "
                              "(see nondet probe --cuda-graphs).")] = None,
    fail_fast: Annotated[Optional[bool], typer.Option(
        "--fail-fast", help="Batch axis: stop each batched call once every compared row's verdict is settled (a "
                            "token or logprob past the requirement, or min-divergence-step's steps agreeing): a "
                            "failing gate ends sooner, its streams cut there. identical, max-logprob-diff and "
                            "min-divergence-step only.")] = None,
    prefix_cache: Annotated[Optional[str], typer.Option(
        "--prefix-cache", help="Batch axis: also each prompt alone with its first N tokens' KV cache left by an "
                               "earlier request, vs one prefill (see nondet probe --prefix-cache), e.g. auto.")] = None,
    chunked_prefill: Annotated[Optional[str], typer.Option(
        "--chunked-prefill", help="Batch axis: also each prompt alone prefilled in chunks of C tokens, vs one "
                                  "pass (see nondet probe --chunked-prefill), e.g. 16,64.")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Write JUnit XML here (one test case per condition).")] = None,
    bisect: Annotated[bool, typer.Option("--bisect/--no-bisect", help="Bisect the first failing condition.")] = True,
    out: o.OutOpt = None,
) -> None:
    r"""Fail CI when a model's answers depend on the batch: a probe under a policy.

    Probes each prompt (settings: flags, else \[tool.nondet] in the repository's
    pyproject.toml or a nondet.toml, else defaults: the embedded demo model, one
    built-in prompt) and checks every condition
    against the prompt alone at batch size 1. The requirement is ONE of:
    identical (default: same tokens, bit-identical logprobs), --max-distinct N,
    --min-divergence-step S, --max-logprob-diff X, or --max-flip-rate P (the
    95% upper bound of the token flip rate below P).

    Other axes, each under its own policy: --speculative FORMS judges each
    speculative form against plain greedy decoding (\[tool.nondet]
    speculative = "identical"); --rl runs nondet rl and judges each trainer
    micro-batch size against the sampler's logprobs (rl = "identical", or
    --max-kl X: the k3 KL estimate at most X). Flags that name an axis run
    those axes; else the config file's keys name them. The first failing
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
      5  the server's answer was malformed (--endpoint)
      70 internal error (a bug: NONDET_DEBUG=1 shows the traceback)
      130 interrupted (Ctrl-C: the run directories keep what was written)

    Examples:
      nondet gate --junit junit.xml             # demo model: exits 1
      nondet gate --kernels batch-invariant     # nondet's kernels: exits 0
      nondet gate --model ./my-model -b 1,8 --max-distinct 2
      nondet gate --prompts prompts.jsonl       # JSONL or plain lines, as probe
      nondet gate --speculative ngram:4,self:4  # speculative vs plain greedy
      nondet gate --rl --micro-batch 1,4 --kernels batch-invariant
    """
    from nondet.gate.config import find_config, load_config, resolve
    from nondet.gate.junit import check_junit_path
    from nondet.gate.run import GateOutputs, run_targets

    from nondet.cli.options import check_utf8

    prompt = [check_utf8(p, "--prompt") for p in prompt] if prompt else None
    flags = {"model": model_of(model_arg, model), "prompts": prompt,
             "prompts-file": str(prompts_file) if prompts_file else None, "batch-sizes": batch_sizes,
             "positions": positions, "runs": runs, "max-new-tokens": max_new_tokens, "kernels": kernels,
             "require": require, "max-distinct": max_distinct, "min-divergence-step": min_divergence_step,
             "max-logprob-diff": max_logprob_diff, "max-flip-rate": max_flip_rate, "dtype": dtype, "device": device,
             "threads": threads,
             "workers": workers, "load": load, "endpoint": endpoint, "rate": rate, "concurrency": concurrency,
             "inject-variance": inject_variance, "speculative-forms": speculative, "rl": rl, "max-kl": max_kl,
             "micro-batch": micro_batch, "sampler-batch": sampler_batch, "compile": compile, "cuda-graphs": cuda_graphs,
             "fail-fast": fail_fast,
             "prefix-cache": prefix_cache, "chunked-prefill": chunked_prefill}
    source = config if config is not None else find_config(Path.cwd())
    settings = resolve(flags, load_config(source) if source else {}, source)
    if junit:
        check_junit_path(junit)
    outputs = GateOutputs(str(junit) if junit else None, bisect)
    targets = gate_targets(settings, str(out) if out else None)
    _check_contexts(targets)
    result = run_targets(targets, outputs, _hooks(outputs))
    sys.exit(0 if result.passed else 1)  # sys.exit, not typer.Exit: standalone_mode=False would swallow it


def gate_targets(settings: "GateSettings", out: str | None) -> "list[GateTarget]":
    """What the gate runs, per axis in settings.axes. One axis: its run directories are OUT (or
    OUT/prompt-N when prompts are probed one by one, see probe_configs); several: OUT/AXIS (or
    OUT/AXIS/prompt-N). All configs are built, so checked, before any model loads."""
    from nondet.gate.run import GateTarget
    from nondet.prompt import label

    several = len(settings.axes) > 1
    base = out or _default_run_dir()
    targets = []
    for axis in settings.axes:
        where = str(Path(base) / axis) if several else base
        if axis == "rl":
            targets.append(GateTarget(rl_config(settings, where), settings.rl_policy, "rl" if several else ""))
            continue
        policy = settings.speculative_policy if axis == "speculative" else settings.policy
        configs = probe_configs(settings, where, settings.speculative_forms if axis == "speculative" else None)
        for config in configs:
            names = ([axis] if several or axis != "batch" else []) + (
                [f"prompt {label(config.prompt)[:60]!r}"] if len(configs) > 1 else [])
            targets.append(GateTarget(config, policy, ": ".join(names)))
    return targets


def _check_contexts(targets: "list[GateTarget]") -> None:
    """Every probe's prompts fit its model's context (nondet rl's prompts are its own to check)."""
    from nondet.cli.probe_config import check_context
    from nondet.probes.probe import ProbeConfig

    for target in targets:
        if isinstance(target.config, ProbeConfig):
            check_context(target.config)


def _default_run_dir() -> str:
    from nondet.probes.probe import default_run_dir

    return default_run_dir("gate")


def probe_configs(settings: "GateSettings", out: str | None, speculative: str | None = None) -> "list[ProbeConfig]":
    """One ProbeConfig per prompt: its run directory is OUT, or OUT/prompt-N with several prompts.
    speculative: the forms to probe (batch size 1), or None for the batch sizes."""
    from nondet.cli.probe_config import build_load_config, build_probe_config
    from nondet.gate.run import prompt_dirs
    from nondet.probes.probe import validate_config, with_chat_endpoint

    load = build_load_config(settings.load, settings.endpoint, rate=settings.rate, concurrency=settings.concurrency)
    if _every_row_a_target(settings, speculative, load):  # one run: the other rows are the other prompts
        groups = [(settings.prompts, out or _default_run_dir())]
    else:
        groups = [((prompt,) if prompt else (), run_dir) for prompt, run_dir in prompt_dirs(settings.prompts, out)]
    configs = [build_probe_config("gate", prompts, model=settings.model, dtype=settings.dtype,
                                  device=settings.device, inject_variance=settings.inject_variance,
                                  batch_sizes=_batch_sizes(settings, speculative, load), out=run_dir, load=load,
                                  speculative=speculative, placement=settings.positions, runs=settings.runs,
                                  max_new_tokens=settings.max_new_tokens, kernels=(settings.kernels,),
                                  threads=settings.threads, prefill=() if speculative else settings.prefill,
                                  workers=1 if speculative else settings.workers,
                                  compile_backend="inductor" if settings.compile else None,
                                  cuda_graphs=settings.cuda_graphs and not speculative,
                                  fail_fast=settings.policy.describe() if settings.fail_fast and not speculative
                                  else None)
               for prompts, run_dir in groups]
    for config in configs:  # now, before any axis runs: e.g. a chat prompt on an axis that takes plain text
        validate_config(with_chat_endpoint(config))
    return configs


def _batch_sizes(settings: "GateSettings", speculative: str | None, load) -> "tuple[int, ...] | None":
    """The batch sizes for a source that reads them (static batches); for a server or the continuous engine
    only sizes the user gave, which validate_config then refuses (the gate's own default is not a choice)."""
    from nondet.gate.config_values import DEFAULT_BATCH_SIZES

    if speculative:
        return None
    if settings.batch_sizes is None:
        return DEFAULT_BATCH_SIZES if load.mode == "static" else None
    return settings.batch_sizes


def _every_row_a_target(settings: "GateSettings", speculative: str | None, load) -> bool:
    """Several prompts on the batch axis, static batches, a row placement: ONE probe whose batches
    hold the prompts themselves: ceil(P/B) generate calls per batch size, not P."""
    from nondet.probes.core.conditions import ROW_PLACEMENTS, resolve_placement

    if speculative or load.mode != "static" or len(settings.prompts) <= 1:
        return False
    return resolve_placement(settings.positions, len(settings.prompts), settings.runs) in ROW_PLACEMENTS


def rl_config(settings: "GateSettings", out: str) -> "RLConfig":
    """nondet rl's config from the gate's settings: every prompt is sampled (none: the built-in set)."""
    from nondet.probes.models.loading import ModelSpec
    from nondet.rl.config import RLConfig, validate

    if settings.endpoint or settings.load != "static":
        from nondet.errors import UsageError

        raise UsageError("--rl runs sampler and trainer in process; drop --endpoint / --load")
    config = RLConfig(model=ModelSpec(settings.model, settings.dtype, settings.device,
                                      inject_variance=settings.inject_variance),
                      prompts=settings.prompts, max_new_tokens=settings.max_new_tokens,
                      sampler_batch=settings.sampler_batch, micro_batches=settings.micro_batches,
                      kernels=(settings.kernels,), threads=settings.threads, out=out,
                      argv=tuple(sys.argv[1:]))
    if config.prompts:
        validate(config)  # now, before any model loads (run_rl validates again with its default prompts)
    return config


def _hooks(outputs) -> "GateHooks":
    from nondet.cli.probe import run_keeping_streams, write_report_if_available
    from nondet.gate.run import GateHooks

    return GateHooks(  # Ctrl-C or out of memory during a probe names its run directory
        probe=lambda config: run_keeping_streams(config, quiet=not sys.stderr.isatty()),  # no bar in CI logs
        rl=_run_rl,
        on_judged=lambda gated: _print(gated, outputs.junit),
        on_bisect=lambda run_dir, line: print(f"bisect: {line} (bisect.json in {run_dir})", flush=True),
        on_warning=lambda text: print(f"nondet: warning: {text}", file=sys.stderr),
        report=write_report_if_available,
    )


def _print(gated: "list[Gated]", junit: str | None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console()
    for g in gated:
        _print_run(g, console)
        for c in g.verdict.conditions:  # Text, not markup: model text may hold [brackets]
            mark = Text("PASS ", style="green") if c.passed else Text("FAIL ", style="bold red")
            console.print(mark + Text(c.condition_id + (f": {c.message}" if c.message else "")), soft_wrap=True)
        console.print(Text(f"nondet gate: {g.verdict.message}", style="bold"), soft_wrap=True)
    if junit:
        console.print(Text(f"junit: {junit}"), soft_wrap=True)


def _run_rl(config: "RLConfig"):
    from nondet.rl.run import run_rl

    return run_rl(config)


def _print_run(g: "Gated", console) -> None:
    """The run's own table: nondet rl's metrics, or the probe's summary (and its speculative table)."""
    if g.verdict.policy.axis == "rl":
        from nondet.cli.rl import metrics_table

        console.print(metrics_table(g.summary["rl"]["pairs"]))
        console.print(f"run directory: {g.run_dir}", markup=False, highlight=False)
        return
    from nondet.cli.render import print_probe_summary
    from nondet.cli.render_speculative import print_speculative

    print_probe_summary(g.summary, g.run_dir, console)
    print_speculative(g.summary, console)
