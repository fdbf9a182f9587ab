"""The one place the CLI builds a ProbeConfig: `nondet probe`, `nondet bisect` (no RUN_DIR) and
`nondet gate` (one per prompt) share it, so a flag means the same in all three."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from nondet.probes.core.load_config import LoadConfig
    from nondet.probes.probe import ProbeConfig
    from nondet.prompt import Prompt


def build_probe_config(command: str, prompts: "Sequence[Prompt]" = (), *, model: str | None = None,
                       dtype: str = "bfloat16", device: str = "cpu", attn_implementation: str | None = None,
                       trust_remote_code: bool = False, inject_variance: bool | None = None,
                       batch_sizes: str | Sequence[int] | None = None, out: str | Path | None = None,
                       load: "LoadConfig | None" = None, speculative: str | None = None,
                       **fields) -> "ProbeConfig":
    """A ProbeConfig from the common options.

    command: names the default run directory (nondet-runs/<time>-<command>) when out is None.
    prompts: the target prompts; () = the default prompt; several are each diffed on their own.
    batch_sizes: '1,2,8' / '1-16' as typed, sizes already parsed, or None for the default,
      which depends on the number of prompts (default_batch_sizes).
    speculative: '--speculative' as typed ('ngram:4,self:4'); checked here, before any model
      loads; it runs at batch size 1 only, so batch sizes above 1 are a usage error.
    fields: the other ProbeConfig fields as they are (placement, runs, fillers, ragged, workers (a count,
      or "auto": run_probe picks it for this host),
      max_new_tokens, temperature, seed, kernels, threads).
    """
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, default_run_dir

    prompts = tuple(prompts)
    if prompts:
        fields.update(prompt=prompts[0], prompts=prompts if len(prompts) > 1 else ())
    if load is not None:
        fields["load"] = load
    if speculative is not None:
        fields["speculative"], batch_sizes = _speculative(speculative, batch_sizes, prompts)
    return ProbeConfig(
        model=ModelSpec(model, dtype, device, attn_implementation, trust_remote_code, inject_variance),
        # --resume writes into the directory it finishes: no default of its own, so a given --out is refused
        batch_sizes=_batch_sizes(batch_sizes, prompts),
        out=str(out) if out else (None if load is not None and load.resume else default_run_dir(command)),
        argv=tuple(["nondet"] + sys.argv[1:]), **fields,
    )


def check_context(config: "ProbeConfig") -> None:
    """An in-process probe's prompts must fit the model's context with -n new tokens: refused now, in a
    second, not after the sweep ran them (a server's model is the server's to check)."""
    from nondet.probes.models.context import check_prompts_fit

    if config.load.mode != "server":
        check_prompts_fit(config.model, config.targets, config.max_new_tokens, config.chat, config.system,
                          ragged_batch=max(config.batch_sizes or (0,)) if config.ragged else 0)


def build_load_config(load: str = "static", endpoint: str | None = None, resume: str | Path | None = None,
                      **fields) -> "LoadConfig":
    """The traffic around the target: --endpoint (or --resume) means a live server, else --load.
    fields: rate, concurrency, filler_requests, chat, tokenizer, api_key_env, timeout."""
    from nondet.probes.core.load_config import LoadConfig

    mode = "server" if endpoint or resume else load
    return LoadConfig(mode=mode, endpoint=endpoint, resume=str(resume) if resume else None, **fields)


def _speculative(text: str, batch_sizes, prompts: "tuple[Prompt, ...]") -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The parsed forms and batch size 1; a usage error for a bad form or a batch size > 1."""
    from nondet.errors import UsageError
    from nondet.probes.speculative.speculation import parse_speculative

    forms = parse_speculative(text)
    if not forms:
        raise UsageError("--speculative needs at least one form, e.g. ngram:4,self:4")
    if batch_sizes is not None and max(_batch_sizes(batch_sizes, prompts)) > 1:
        raise UsageError("--speculative runs at batch size 1 (transformers' assisted decoding takes one sequence); "
                         "drop --batch-sizes")
    return tuple(f.name for f in forms), (1,)


def default_batch_sizes(prompts: "Sequence[Prompt]") -> str:
    """One prompt: the full sweep. Several: fewer sizes each, so the demo's 8 prompts take
    about the time of one prompt's full sweep (README, "The demo")."""
    return "1,2,4,8,16" if len(prompts) <= 1 else "1,2,8"


def _batch_sizes(value: str | Sequence[int] | None, prompts: "tuple[Prompt, ...]") -> tuple[int, ...]:
    from nondet.errors import UsageError
    from nondet.probes.core.conditions import parse_batch_sizes

    if isinstance(value, str) and not value.strip():  # -b "": a sweep the user did not ask for is no default
        raise UsageError("--batch-sizes is empty; give sizes like 1,2,8 or a range like 1-16 (or leave the flag "
                         "out for the default)")
    if value is None or isinstance(value, str):
        return parse_batch_sizes(value or default_batch_sizes(prompts))
    return tuple(value)


def demo_defaults(targets: tuple[str, ...], chat: bool, batch_sizes: str | None,
                  max_new_tokens: int | None) -> tuple[tuple[str, ...], bool, str | None, int | None]:
    """No model and no prompt given: on the trained demo model, its chat-formatted questions, batch
    sizes and length (probes/models/demo_model.py), where the user left them unset; else unchanged."""
    from nondet.probes.models.demo_model import DEMO_BATCH_SIZES, DEMO_MAX_NEW_TOKENS, DEMO_QUESTIONS, demo_kind

    if demo_kind() != "trained":
        return targets, chat, batch_sizes, max_new_tokens
    return (DEMO_QUESTIONS, True, DEMO_BATCH_SIZES if batch_sizes is None else batch_sizes,  # -b '' is refused later
            DEMO_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens)
