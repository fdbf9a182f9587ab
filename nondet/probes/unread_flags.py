"""Flags the source that runs a probe would not read: refused in one line, never recorded and ignored.

config.json records every ProbeConfig field, so a flag that the chosen source never reads would sit in
the run directory as if it had shaped the run (`--tp 2 --kv-cache static` once decoded on the dynamic
cache; `--endpoint --inject-variance` injected nothing into a server's model). Each rule names a flag,
how to tell it was given (its field differs from the dataclass default), and the sources that read it;
anything else given is a usage error naming every such flag at once.
"""

import dataclasses
from typing import Callable

from nondet.errors import UsageError

IN_PROCESS = frozenset({"static", "tp", "speculative", "continuous"})
SERVERS = frozenset({"server", "against", "server-prefix"})
TRAFFIC = frozenset({"continuous", "server", "against"})  # sources that send filler requests around the target
NEW_RUNS = IN_PROCESS | SERVERS  # every source but --resume, which sends the prompt its run directory stored

# (flag as the CLI spells it, the field's path in ProbeConfig, the sources that read it)
RULES: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("--prompt / --prompt-file / --prompts", "prompt", NEW_RUNS),  # several prompts set it too (the first)
    ("--out", "out", NEW_RUNS),  # --resume writes into its own directory (the CLI gives it no default)
    ("--batch-sizes", "batch_sizes", frozenset({"static", "tp", "speculative"})),  # speculative: checked = 1
    ("--positions", "placement", frozenset({"static", "tp"})),
    ("--ragged", "ragged", frozenset({"static", "tp"})),
    ("--runs", "runs", frozenset({"static", "tp"}) | TRAFFIC),
    ("--fillers", "fillers", frozenset({"static", "tp"}) | TRAFFIC),
    ("--threads", "threads", IN_PROCESS),
    ("--dtype", "model.dtype", IN_PROCESS),
    ("--device", "model.device", IN_PROCESS),
    ("--attn-implementation", "model.attn_implementation", IN_PROCESS),
    ("--trust-remote-code", "model.trust_remote_code", IN_PROCESS),
    ("--inject-variance / --no-inject-variance", "model.inject_variance", IN_PROCESS),
    ("--kernels / --confirm", "kernels", IN_PROCESS),
    ("--allow-uncovered", "allow_uncovered", frozenset({"static", "tp", "speculative"})),
    ("--fail-fast", "fail_fast", frozenset({"static"})),
    ("--rate", "load.rate", TRAFFIC),
    ("--concurrency", "load.concurrency", TRAFFIC),
    ("--filler-requests", "load.filler_requests", TRAFFIC),
    ("--tokenizer", "load.tokenizer", SERVERS),
    ("--timeout", "load.timeout", SERVERS | {"server-resume"}),
    ("--api-key-env", "load.api_key_env", SERVERS | {"server-resume"}),
    ("retries", "load.retries", SERVERS | {"server-resume"}),  # library only
)

SOURCE_TEXT = {
    "static": "static batches",
    "tp": "--tp's static batches",
    "speculative": "--speculative (the prompt alone at batch size 1, plain and assisted decoding)",
    "continuous": "--load continuous (one prompt replayed by the in-process engine among its fillers)",
    "server": "--endpoint (the server runs its own model, dtype and kernels)",
    "against": "--endpoint with --against (each server runs its own model, dtype and kernels)",
    "server-prefix": "--endpoint with --prefix-cache / --chunked-prefill (the prompt alone against its own "
                     "prefill; the server runs its own model and kernels)",
    "server-resume": "--resume (the run keeps the settings it started with; --endpoint, --timeout and "
                     "--api-key-env may be given anew)",
}


def source_kind(config) -> str:
    """Which source runs this ProbeConfig (probe.make_source dispatches on it)."""
    if config.tp:
        return "tp"
    if config.load.mode == "server" and config.load.resume and not config.load.against:
        return "server-resume"
    if config.prefill and config.load.mode == "server":
        return "server-prefix"
    if config.speculative:
        return "speculative"
    if config.load.mode == "continuous":
        return "continuous"
    if config.load.against:
        return "against"
    if config.load.mode == "server":
        return "server"
    return "static"


def refuse_unread_flags(config) -> None:
    """A UsageError naming every given flag that the config's source would not read."""
    kind = source_kind(config)
    refuse_unread(config, RULES, kind, SOURCE_TEXT[kind])


def refuse_unread(config, rules, kind: str, where: str) -> None:
    """A UsageError naming every flag of `rules` ((flag, field path, kinds that read it)) given in config
    while `kind` does not read it; where: what runs, as the message names it. nondet rl's sampler rules too."""
    unread = [flag for flag, path, readers in rules if kind not in readers and given(config, path)]
    if unread:
        one = len(unread) == 1
        raise UsageError(f"{', '.join(unread)} {'does' if one else 'do'} not apply to {where}; "
                         f"drop {'it' if one else 'them'}")


def given(config, path: str) -> bool:
    """Does the field at path of a config dataclass differ from its default (the user set it)?"""
    owner, name = config, path
    if "." in path:
        head, name = path.split(".")
        owner = getattr(config, head)
    return getattr(owner, name) != _default(type(owner), name)


def _default(cls, name: str):
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    factory: Callable | None = None if field.default_factory is dataclasses.MISSING else field.default_factory
    return factory() if factory is not None else field.default
