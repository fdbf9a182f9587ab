"""`nondet probe`: replay a prompt under many batch conditions and diff the token streams.

Three loads: static batches (default), `--load continuous` (transformers' continuous-batching
engine in process, fillers arriving every step), and `--endpoint URL` (a live server).
"""

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
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="File of target prompts: JSONL, a line a JSON string or {\"prompt\": ...} (text, newlines "
                          "allowed) or {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (a chat, always "
                          "sent through the chat template; text lines stay text unless --chat), when the first line "
                          "starts with { or \"; else plain text, one prompt a line. Each is swept and diffed against "
                          "itself alone. Default without --prompt: the trained demo model's 4 chat questions, "
                          "else 8 built-in prompts (static load).")] = None,
    batch_sizes: o.BatchSizesOpt = None,
    positions: Annotated[str, typer.Option(
        help="Target rows in each batch: auto (rows with several prompts, else ends) | ends (first and last) | "
             "first | last | all (every row a copy): one prompt per batch among same-length fillers. "
             "rows: every row a target, prompts of equal token length share batches (no padding). "
             "padded: every row a target, all prompts in left-padded batches (a labelled condition).")] = "auto",
    runs: Annotated[Optional[int], typer.Option(
        help="Static: spread N target replays over the batches (overrides --positions). Continuous / "
             "--endpoint: N replays under load (default 8 / 16), plus the reference sent alone.")] = None,
    fillers: Annotated[Optional[Path], typer.Option(
        help="File of filler prompts, one per line (default: a built-in multilingual set).")] = None,
    trials: Annotated[int, typer.Option(
        "--trials", help="Static: run every batch N times, each repeat with the fillers rotated (other requests in "
                         "the other rows): more runs, a tighter interval on the flip rate. A server's --runs are "
                         "its trials.")] = 1,
    ragged: Annotated[bool, typer.Option(
        "--ragged", help="Also run left-padded batches of unequal lengths (a separate, labelled condition).")] = False,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", help="Tokens generated per request (default 200; 64 on the trained demo model).",
        callback=o.at_least_one)] = None,
    temperature: Annotated[float, typer.Option(help="0 = greedy. >0 samples; each request has its own seeded generator.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of each request's generator when sampling.")] = 0,
    sampler: Annotated[str, typer.Option(
        "--sampler", help="With --temperature > 0: per-request (each request its own generator seeded with --seed, "
                          "so a row's draws never depend on the batch) or shared (one generator for the whole "
                          "batch, rows drawn in order, as transformers' batched sampling and a server that ignores "
                          "seeds do). The verdict says when a flip came from the sampler, not the logits.")] = "per-request",
    kernels: o.KernelsOpt = "default",
    confirm: Annotated[bool, typer.Option(
        "--confirm", help="Run default kernels, then batch-invariant ones, and compare.")] = False,
    dtype: o.DtypeOpt = "bfloat16",
    device: o.DeviceOpt = "cpu",
    attn_implementation: o.AttnOpt = None,
    trust_remote_code: o.TrustOpt = False,
    inject_variance: o.InjectOpt = None,
    threads: o.ThreadsOpt = None,
    workers: o.WorkersOpt = None,
    out: o.OutOpt = None,
    json_output: o.JsonOpt = False,
    load: Annotated[str, typer.Option(
        "--load", help="static (one batched generate per condition) | continuous (transformers' continuous-batching "
                       "engine, in process). --endpoint implies a server load.")] = "static",
    rate: Annotated[Optional[float], typer.Option(
        help="Filler arrival rate (Poisson): per engine step with --load continuous (default 0.5), "
             "requests per second with --endpoint (default 4).")] = None,
    concurrency: Annotated[Optional[int], typer.Option(
        help="Continuous: most fillers in the engine at once (default 8). --endpoint: most copies "
             "in flight at once (default all).")] = None,
    filler_requests: Annotated[Optional[int], typer.Option(
        "--filler-requests", help="Filler requests: per run with --load continuous (default 24), in all with "
                                  "--endpoint (default 2 x runs). Their texts come from --fillers.")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        help="Probe a live OpenAI-compatible server at this base URL, e.g. http://127.0.0.1:8000. "
             "--model then names the served model (default: the first of /v1/models).")] = None,
    against: Annotated[Optional[str], typer.Option(
        help="Compare the --endpoint deployment (A) with this second one (B) of the same model: the same "
             "prompt and load on each, A first. The reference is A's request sent alone; per side: distinct "
             "completions and first divergence from its own request alone; across: distinct completions, the "
             "first token where B alone leaves A alone, and the first step whose logprob bits differ where both "
             "return logprobs.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Format each plain-text prompt as a chat turn: in process "
                                                      "through the tokenizer's chat template (the ids a server's chat "
                                                      "endpoint gives the model); with --endpoint, "
                                                      "/v1/chat/completions. A {\"messages\": ...} prompt is sent "
                                                      "as a chat without it.")] = False,
    system: Annotated[Optional[str], typer.Option(
        "--system", help="With --chat: the system message of plain-text prompts (default: the chat template's "
                         "own); a {\"messages\": ...} prompt keeps its own messages.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="Tokenizer (dir or hub id) for comparing a server's texts token by token when it returns no logprobs.")] = None,
    api_key_env: Annotated[str, typer.Option(
        "--api-key-env", help="Environment variable holding the server's API key (never written to disk).")] = "OPENAI_API_KEY",
    timeout: Annotated[float, typer.Option(
        help="Seconds a server request may take; past it the probe stops (not resent: the server may still be busy).")] = 600.0,
    resume: Annotated[Optional[Path], typer.Option(
        help="Finish an interrupted --endpoint probe in this run directory; completed requests are not resent.")] = None,
    budget: Annotated[Optional[float], typer.Option(
        "--budget", help="Seconds the probe may take (static load): short timing calls plan the sweep to fit; "
                         "the references first, then the largest batch size, the smallest, the rest. What is "
                         "left out is printed and kept in summary.json.")] = None,
    speculative: Annotated[Optional[str], typer.Option(
        "--speculative", help="Compare plain greedy decoding with speculative decoding, comma-separated: ngram:K "
                              "(prompt lookup), self:K (the model drafts for itself), draft[:K] (the embedded draft) "
                              "or draft:MODEL[:K]. Batch size 1 only (transformers' assisted decoding takes one "
                              "sequence), so it does not combine with --batch-sizes.")] = None,
    tp: Annotated[Optional[str], typer.Option(
        "--tp", help="Tensor parallelism: run every condition with N worker processes (transformers' "
                     "tp_plan=\"auto\"; gloo on CPU, NCCL on CUDA, rank r on cuda:r). Several degrees, e.g. 1,2, "
                     "share one run directory; the smallest holds the reference, and the summary shows the "
                     "batch variance at each degree and each degree against it.")] = None,
    tp_invariant: Annotated[bool, typer.Option(
        "--tp-invariant", help="With --tp and the batch-invariant mode: row-parallel linears reduce K as one "
                               "fixed tree that every degree follows (powers of 2), so TP1 and TPN give the same "
                               "bits. Default kernels are left as they are.")] = False,
    kv_cache: Annotated[str, typer.Option(
        "--kv-cache", help="KV cache of the static batches' generate: dynamic (transformers' default) or static "
                           "(preallocated prompt + max-new-tokens positions, the layout CUDA graphs need; "
                           "never compiled). The mode gives the same bits with either.")] = "dynamic",
    allow_uncovered: Annotated[bool, typer.Option(
        "--allow-uncovered", help="With batch-invariant kernels, run a model whose op census finds ops the "
                                  "mode does not cover (refused otherwise, exit 3); the run is labelled partly "
                                  "invariant and lists them (see nondet kernels coverage).")] = False,
    prefix_cache: Annotated[Optional[str], typer.Option(
        "--prefix-cache", help="Prefix cache, warm vs cold: each prompt alone with its first L tokens' KV cache "
                               "left by an earlier request and the rest prefilled on top, vs one prefill of the "
                               "whole prompt. Token counts, e.g. 8,16,32, or auto (a quarter, half and three "
                               "quarters of the prompt).")] = None,
    chunked_prefill: Annotated[Optional[str], typer.Option(
        "--chunked-prefill", help="Chunked prefill vs one pass: each prompt alone, prefilled in chunks of C tokens "
                                  "(one forward each, on the cache the chunks before left), e.g. 4,16,64, or auto "
                                  "(an eighth, a quarter and half of the prompt).")] = None,
    compile: Annotated[bool, typer.Option(
        "--compile", help="Decode on the compiled path a deployment uses: transformers' torch.compile'd generate "
                          "with a static KV cache (CUDA graphs on CUDA), default kernels and the mode alike (with "
                          "--tp, on every rank). "
                          "Compile and warm-up time are reported apart; a kernels mode that cannot compile runs "
                          "eager, and the summary says so.")] = False,
    cuda_graphs: Annotated[bool, typer.Option(
        "--cuda-graphs", help="Decode with the eager kernels replayed from CUDA graphs, one recorded per batch "
                              "shape on a static KV cache (how SGLang serves by default): no compiler, so it "
                              "starts in seconds, and the bits are those of --kv-cache static. CUDA only; "
                              "record and warm-up time are reported apart.")] = False,
) -> None:
    """Replay one prompt under varying batch sizes and positions; find where outputs diverge.

    The reference is the prompt alone at batch size 1. Every run is diffed against it: the
    first step whose token differs, the first step whose logprob bits differ, the distinct
    completions, and the branch points.

    Example:  nondet probe --batch-sizes 1,2,4,8,16 --max-new-tokens 200
    Under load:  nondet probe --load continuous --runs 8 --rate 0.5 --concurrency 8
    A server:  nondet probe --endpoint http://127.0.0.1:8000 --runs 16 --tokenizer DIR
    Two deployments:  nondet probe --endpoint http://127.0.0.1:8000 --against http://127.0.0.1:8001
    Speculative decoding:  nondet probe --speculative ngram:4,self:4 --confirm
    Prefix cache and chunked prefill:  nondet probe -b 1 --prefix-cache auto --chunked-prefill 4,16 --confirm
    In a time budget:  nondet probe --batch-sizes 1,2,4,8,16 --budget 60
    Compiled, as deployed:  nondet probe --compile --confirm --device cuda
    Eager kernels in CUDA graphs:  nondet probe --cuda-graphs --confirm --device cuda
    Tensor parallelism:  nondet probe --tp 1,2 --batch-sizes 1,2,8 --confirm

    Exit codes: 0 probed (whatever it found: `nondet gate` turns findings into 1), 2 usage error,
    3 could not run (model, memory, server unreachable), 4 --resume of a bad run directory, 5 bad
    server response (answers already received are kept), 70 internal error, 130 interrupted.
    """
    from nondet.cli.options import read_lines_file, read_targets
    from nondet.cli.probe_config import build_load_config, build_probe_config, check_context, demo_defaults
    from nondet.probes.core.corpus import FILLERS
    from nondet.probes.core.prefill import parse_prefill

    load_config = build_load_config(load, endpoint, resume, rate=rate, concurrency=concurrency,
                                    filler_requests=filler_requests, chat=chat, tokenizer=tokenizer,
                                    api_key_env=api_key_env, timeout=timeout, against=against)
    targets = read_targets(prompt, prompt_file, prompts, several_by_default=load_config.mode == "static")
    if model is None and load_config.mode == "static" and not (prompt or prompt_file or prompts or speculative or tp):
        targets, chat, batch_sizes, max_new_tokens = demo_defaults(targets, chat, batch_sizes, max_new_tokens)
    config = build_probe_config(
        "probe", targets, model=model, dtype=dtype, device=device, attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code, inject_variance=inject_variance, batch_sizes=batch_sizes, out=out,
        load=load_config, placement=positions, runs=runs,
        fillers=read_lines_file(fillers, "fillers") if fillers else FILLERS,
        ragged=ragged, trials=trials, max_new_tokens=max_new_tokens or 200, temperature=temperature, seed=seed, sampler=sampler,
        kernels=("default", "batch-invariant") if confirm else (kernels,), threads=threads, speculative=speculative,
        workers=workers or 1, budget=budget, kv_cache=kv_cache, tp_invariant=tp_invariant, **_tp_fields(tp),
        compile_backend="inductor" if compile else None, cuda_graphs=cuda_graphs, chat=chat, system=system,
        allow_uncovered=allow_uncovered, prefill=parse_prefill(prefix_cache, chunked_prefill),
    )
    from nondet.probes.probe import validate_config

    validate_config(config)  # the flags' own checks first: the context check reads prompts through the tokenizer
    check_context(config)
    result = run_keeping_streams(config, quiet=json_output)
    write_report_if_available(result.run_dir)
    if json_output:
        print(json.dumps({"run_dir": str(result.run_dir), "seconds": round(result.seconds, 2),
                          **result.summary}, indent=1))
        return
    from rich.console import Console

    from nondet.cli.render import print_probe_summary
    from nondet.cli.render_against import print_against
    from nondet.cli.render_prefill import print_prefill
    from nondet.cli.render_speculative import print_speculative

    console = Console()
    print_probe_summary(result.summary, result.run_dir, console)
    print_load_notes(result.summary, console)
    print_budget_notes(result.summary, console)
    print_speculative(result.summary, console)
    print_prefill(result.summary, console)
    print_against(result.summary, console)
    print_tp_lines(result.summary, console)
    print_model_note(result.run_dir, console)
    console.print(f"wall time: {result.seconds:.1f} s")


def print_model_note(run_dir, console) -> None:
    """Which model the numbers came from when it was not the user's: the demo, and the variance
    built into it on purpose (a reader must not take that for this host's kernels)."""
    from nondet.reports.content import defaults_not_applied, dtype_note
    from nondet.rundir import RunDir
    from nondet.rundir.reader import read_fingerprint

    model = (read_fingerprint(RunDir(run_dir)) or {}).get("model") or {}
    if model.get("generation_defaults_ignored"):
        console.print(f"model: {defaults_not_applied(model['generation_defaults_ignored'])}")
    if model.get("checkpoint_dtype"):
        console.print(f"model: {dtype_note(model)}")
    if not model.get("embedded_default"):
        return
    line = f"model: the demo model {model.get('name')} ({'trained' if model.get('demo') == 'trained' else 'random weights'})"
    if model.get("injected_variance"):
        line += (f", with {model['injected_variance']} made batch-variant on purpose, as a split-reduction kernel "
                 "is on a busy GPU server; --no-inject-variance probes this host's own kernels, --model DIR yours")
    console.print(line)


def _tp_fields(tp: str | None) -> dict:
    """--tp as typed -> {"tp": degrees}; none given -> {} (one process, as before)."""
    if tp is None:
        return {}
    from nondet.probes.tp.degrees import parse_tp

    return {"tp": parse_tp(tp)}


def run_keeping_streams(config, quiet: bool):
    """run_with_progress; out of memory and Ctrl-C name where the streams already written are."""
    from nondet.errors import Interrupted, OutOfMemoryError

    where = config.load.resume or config.out
    try:
        return run_with_progress(config, quiet)
    except OutOfMemoryError as exc:
        raise OutOfMemoryError(f"{exc}; streams already written stay in {where}") from exc
    except KeyboardInterrupt:
        finish = f"; finish it with --resume {where}" if config.load.mode == "server" else ""
        raise Interrupted(f"interrupted; streams already written stay in {where}, an unfinished run "
                          f"directory{finish}") from None


def run_with_progress(config, quiet: bool):
    """run_probe with a rich progress bar on stderr (none with --json)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nondet.probes.probe import run_probe

    if quiet or not Console(stderr=True).is_interactive:  # a bar on a log file is noise (and a stray blank line)
        return run_probe(config)
    if config.load.mode == "server":
        return run_server_with_progress(config)
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


def run_server_with_progress(config):
    """The server probe with a bar: answers on disk of all, requests in flight, failed attempts."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nondet.probes.probe import run_probe, validate_config

    validate_config(config)  # before the bar appears: a usage error is one line on a clean terminal
    columns = (TextColumn("requests"), BarColumn(), MofNCompleteColumn(),
               TextColumn("in flight {task.fields[in_flight]}  failed {task.fields[failed]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("requests", total=None, in_flight=0, failed=0)

        def on_progress(counts):
            progress.update(task, total=counts.total, completed=counts.done, in_flight=counts.in_flight,
                            failed=counts.failed)

        return run_probe(config, on_progress=on_progress)


def print_load_notes(summary: dict, console) -> None:
    """The load settings and caveats (comparison level; what invariance is not claimed for)."""
    load = summary.get("load")
    if not load:
        return
    level = f", compared at level {load['compare_level']}" if load.get("compare_level") else ""
    console.print(f"load: {load['mode']}{level}")
    for note in load.get("notes", []):
        console.print(f"note: {note}")


def print_tp_lines(summary: dict, console) -> None:
    """--tp: per kernels mode, the batch variance at each degree and each degree against the reference."""
    from nondet.fmt import fmt_step

    section = summary.get("tensor_parallel")
    for mode, m in (section or {}).get("modes", {}).items():
        degrees = "; ".join(f"TP{r['tp']} {r['distinct_completions']} distinct, bits from step "
                            f"{fmt_step(r['first_numeric_divergence'])}" for r in m["by_degree"])
        versus = "; ".join(f"TP{r['tp']} vs TP{r['against']}: tokens from step "
                           f"{fmt_step(r['first_token_divergence'])}, bits from step "
                           f"{fmt_step(r['first_numeric_divergence'])}" for r in m["vs_reference"])
        console.print(f"tensor parallel, {mode}: {degrees}" + (f"; {versus}" if versus else ""), soft_wrap=True)


def print_budget_notes(summary: dict, console) -> None:
    """--budget: the plan's estimate and what it left out."""
    budget = summary.get("budget")
    if not budget:
        return
    console.print(f"budget: {budget['seconds']:g} s, sweep planned at about {budget['planned_seconds']:g} s")
    for line in budget["left_out"]:
        console.print(f"left out: {line}")
