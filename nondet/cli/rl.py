"""`nondet rl`: sampler vs trainer logprobs of the same sampled tokens (true on-policy RL)."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from nondet.cli import options as o
from nondet.cli.app import app
from nondet.cli.deprecated_model import HiddenArgumentsCommand, ModelArg, model_of


@app.command("rl", cls=HiddenArgumentsCommand)
def rl(
    model_arg: ModelArg = None,
    model: o.ModelOpt = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="Sampler prompts: JSONL (a JSON string or {\"prompt\": ...} a line, or {\"messages\": "
                          "[...]}: a chat, sampled from its chat template's ids) or plain text, one prompt a line "
                          "(default: 8 built-in).")] = None,
    rollouts: Annotated[Optional[Path], typer.Option(
        "--rollouts", help="JSONL of exported rollouts {prompt_ids, completion_ids, logprobs}: trainer side only.")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        "--endpoint", help="A live OpenAI-compatible server samples (must return logprobs and token ids, e.g. "
        "vLLM); --model is the trainer's copy of its weights.")] = None,
    max_new_tokens: o.MaxNewTokensOpt = 32,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (> 0), replayed by the trainer.")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep the k largest logits; 0 = off.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus truncation; 1 = off.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Request i samples with its own generator seeded SEED + i.")] = 0,
    sampler_batch: Annotated[int, typer.Option(
        "--sampler-batch", help="Prompts per batched generate call of the sampler (left-padded).")] = 8,
    load: Annotated[str, typer.Option(
        "--load", help="In-process sampler: static (batched generate calls) or continuous (every prompt in "
        "transformers' continuous-batching engine).")] = "static",
    micro_batch: Annotated[str, typer.Option(
        "--micro-batch", help="Trainer micro-batch sizes, e.g. 1,4,8: one teacher-forced condition each.")] = "1,4,8",
    padding: Annotated[str, typer.Option(
        help="Trainer layout: right | left (padded rows) or packed (one row per micro-batch, positions restart).")
    ] = "right",
    no_backward: Annotated[bool, typer.Option(
        "--no-backward", help="Skip loss.backward() on the trainer's micro-batches (forward only).")] = False,
    no_exact_kl: Annotated[bool, typer.Option(
        "--no-exact-kl", help="Do not keep the sampler's distributions (4 bytes x vocab per token): no exact KL.")
    ] = False,
    kernels: o.KernelsOpt = "default",
    confirm: Annotated[bool, typer.Option(
        "--confirm", help="Run default kernels, then batch-invariant ones on both sides, and compare.")] = False,
    dtype: o.DtypeOpt = "bfloat16",
    device: o.DeviceOpt = "cpu",
    attn_implementation: o.AttnOpt = None,
    trust_remote_code: o.TrustOpt = False,
    inject_variance: o.InjectOpt = False,
    threads: o.ThreadsOpt = None,
    out: o.OutOpt = None,
    json_output: o.JsonOpt = False,
) -> None:
    """Sample completions, recompute their logprobs the way a trainer does, and measure the mismatch.

    The sampler draws completions of each prompt (batched, per-request seeds) and records
    each sampled token's logprob over the processed distribution (temperature, top-k, top-p).
    The trainer teacher-forces prompt + completion in micro-batches (train mode, nothing random:
    autograd on, backward), replaying the same processing. Per micro-batch size: fraction of
    bit-identical logprobs, |dlogp|, importance ratios outside 1 +- eps, KL estimators k1/k2/k3,
    and the exact KL(sampler || trainer) over the whole processed distributions (in-process).
    With --kernels batch-invariant on both sides, every logprob should be bit-identical.

    Example:  nondet rl --micro-batch 1,4,8 --confirm
    Rollouts:  nondet rl --model MODEL_DIR --rollouts rollouts.jsonl --temperature 1
    Server:    nondet rl --model MODEL_DIR --endpoint http://127.0.0.1:8000 --micro-batch 4
    Engine:    nondet rl --load continuous --confirm

    Exit codes: 0 measured, 2 usage error (flags, prompts or rollouts file), 3 could not run (model,
    memory, server unreachable), 5 bad server response, 70 internal error, 130 interrupted.
    """
    from nondet.errors import UsageError
    from nondet.probes.models.loading import ModelSpec
    from nondet.rl.config import RLConfig
    from nondet.rl.rollouts import read_prompts

    if prompts and rollouts:
        raise UsageError("give either --prompts (sample here) or --rollouts (trainer side only), not both")
    config = RLConfig(
        model=ModelSpec(name=model_of(model_arg, model), dtype=dtype, device=device, attn_implementation=attn_implementation,
                        trust_remote_code=trust_remote_code, inject_variance=inject_variance),
        prompts=read_prompts(str(prompts)) if prompts else (), rollouts=str(rollouts) if rollouts else None,
        endpoint=endpoint,
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        sampler_batch=sampler_batch, load=load, micro_batches=parse_sizes(micro_batch), padding=padding,
        kernels=("default", "batch-invariant") if confirm else (kernels,), backward=not no_backward,
        exact_kl=not no_exact_kl,
        threads=threads, out=str(out) if out else None, argv=tuple(__import__("sys").argv[1:]))
    from nondet.errors import Interrupted
    from nondet.probes.probe import default_run_dir
    from nondet.rl.run import run_rl

    config = replace(config, out=config.out or default_run_dir("rl"))  # named now: Ctrl-C's line says where
    try:
        result = run_rl(config)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; what was already written stays in {config.out}, an unfinished run "
                          "directory") from None
    _write_report(result.run_dir)
    if json_output:
        print(json.dumps({"run_dir": str(result.run_dir), "seconds": round(result.seconds, 2), **result.summary},
                         indent=1))
        return
    from rich.console import Console

    console = Console()
    console.print(metrics_table(result.summary["rl"]["pairs"]))
    console.print(result.summary["verdict"], style="bold", markup=False, highlight=False)
    _print_groups_warning(console, result.summary["rl"])
    console.print(f"run directory: {result.run_dir}")
    console.print(f"wall time: {result.seconds:.1f} s")


def parse_sizes(text: str) -> tuple[int, ...]:
    from nondet.errors import UsageError

    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--micro-batch takes sizes like 1,4,8, not {text!r}") from None
    return sizes


def metrics_table(pairs: list[dict]):
    """One row per (kernels, micro-batch): the metrics RL people read."""
    from rich.table import Table

    from nondet.fmt import fmt_float

    table = Table(title="sampler vs trainer logprobs of the sampled tokens")
    cols = ("kernels", "micro-batch", "tokens", "bit-identical", "max |dlogp|", "mean |dlogp|", "p95 |dlogp|",
            "ratio out 0.1", "ratio out 0.2", "k1", "k2", "k3", "exact KL", "backward")
    for col in cols:
        table.add_column(col, justify="left" if col == "kernels" else "right")
    for p in pairs:
        if not p.get("n_tokens"):
            continue
        grads = "finite" if p.get("grad_finite") else ("not run" if not p.get("backward") else "NOT finite")
        table.add_row(p["kernels"], f"{p['micro_batch']} {p['padding']}", str(p["n_tokens"]),
                      f"{p['frac_identical']:.1%}", *(fmt_float(p[k]) for k in (
                          "dlogp_max", "dlogp_mean", "dlogp_p95")),
                      f"{p['ratio_outside_0.1']:.1%}", f"{p['ratio_outside_0.2']:.1%}",
                      *(fmt_float(p[k]) for k in ("kl_k1", "kl_k2", "kl_k3")), _exact(p), grads)
    table.caption = ("ratio = exp(trainer - sampler logprob); k1/k2/k3: Schulman's KL(sampler || trainer) estimators; "
                     "exact KL: mean over tokens of the full distributions' KL (- where the sampler ran elsewhere)")
    return table


def _exact(pair: dict) -> str:
    from nondet.fmt import fmt_float

    return "-" if pair.get("kl_exact") is None else fmt_float(pair["kl_exact"])


def _print_groups_warning(console, rl: dict) -> None:
    """A GRPO group whose samples are all identical trains on nothing: say so (nothing when none is)."""
    from nondet.rl.groups import warning

    line = warning(rl)
    if line:
        console.print(f"warning: {line}", style="yellow", markup=False, highlight=False)


def _write_report(run_dir) -> None:
    try:
        from nondet.reports import rl_sections  # noqa: F401 - the report knows rl runs
        from nondet.reports import write_report
    except ImportError:
        return
    write_report(run_dir)
