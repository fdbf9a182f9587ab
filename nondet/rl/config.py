"""RLConfig: what `nondet rl` runs, frozen and written to config.json."""

import math
from dataclasses import dataclass, field

from nondet.errors import UsageError
from nondet.probes.models.loading import ModelSpec
from nondet.probes.unread_flags import refuse_unread
from nondet.prompt import Chat, Prompt

PADDINGS = ("right", "left", "packed")  # how the trainer lays out a micro-batch: padded rows, or one packed row
KERNEL_MODES = ("default", "batch-invariant")
LOADS = ("static", "continuous")  # the in-process sampler: batched generate calls, or the continuous-batching engine


@dataclass(frozen=True)
class RLConfig:
    model: ModelSpec = field(default_factory=ModelSpec)
    # sampler prompts (empty = the built-in demo prompts); a Chat is sampled from its chat template's ids
    prompts: tuple[Prompt, ...] = ()
    rollouts: str | None = None  # JSONL of exported rollouts: the trainer side only
    endpoint: str | None = None  # a live server samples (OpenAI-compatible, must return logprobs + token ids)
    max_new_tokens: int = 32  # sampled tokens per prompt (fewer where EOS comes first)
    temperature: float = 1.0  # RL samples at 1; 0 (greedy) has no sampling distribution to compare
    top_k: int = 0  # 0 = off; else keep the k largest logits (ties kept)
    top_p: float = 1.0  # 1 = off; else the smallest set with probability >= top_p
    seed: int = 0  # request i samples with its own generator seeded seed + i
    sampler_batch: int = 8  # prompts per batched generate call (left-padded, as servers batch)
    load: str = "static"  # static: batched generate calls; continuous: every prompt in the continuous-batching engine
    micro_batches: tuple[int, ...] = (1, 4, 8)  # the trainer's micro-batch sizes, one condition each
    padding: str = "right"  # the trainer's layout: right | left padded rows, or packed (one row, positions restart)
    kernels: tuple[str, ...] = ("default",)  # modes, each on BOTH sides ("--confirm" = both modes)
    exact_kl: bool = True  # keep the sampler's processed distributions: exact per-token KL (4 B x vocab a token)
    backward: bool = True  # run loss.backward() on every trainer micro-batch (autograd on)
    threads: int | None = None  # torch CPU threads (None = torch's default); fingerprinted
    out: str | None = None  # run directory (None = nondet-runs/<time>-rl)
    argv: tuple[str, ...] = ()  # the command line, for "reproduce" in reports


def validate(config: RLConfig) -> None:
    """One-line UsageErrors (exit 2) for settings that cannot give the metrics."""
    if config.temperature == 0:
        raise UsageError("--temperature 0 is greedy: there is no sampling distribution whose logprobs "
                         "sampler and trainer could compare; pass --temperature > 0 (RL samples at 1)")
    if not (math.isfinite(config.temperature) and config.temperature > 0):  # nan passes every comparison
        raise UsageError(f"--temperature must be a number > 0, not {config.temperature}")
    if config.top_k < 0:
        raise UsageError(f"--top-k must be >= 0 (0: off), not {config.top_k}")
    if not 0 < config.top_p <= 1:  # False for nan too
        raise UsageError(f"--top-p must be in (0, 1], not {config.top_p}")
    for flag, value in (("--max-new-tokens", config.max_new_tokens), ("--sampler-batch", config.sampler_batch)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, not {value}")
    if not config.micro_batches or min(config.micro_batches) < 1:
        raise UsageError("--micro-batch needs sizes >= 1, e.g. 1,4,8")
    if config.padding not in PADDINGS:
        raise UsageError(f"--padding must be one of {', '.join(PADDINGS)}, not {config.padding!r}")
    for mode in config.kernels:
        if mode not in KERNEL_MODES:
            raise UsageError(f"--kernels must be one of {', '.join(KERNEL_MODES)}, not {mode!r}")
    if config.load not in LOADS:
        raise UsageError(f"--load must be one of {', '.join(LOADS)}, not {config.load!r}")
    if config.load == "continuous" and (config.endpoint or config.rollouts):
        raise UsageError("--load continuous runs the sampler here; it does not combine with --endpoint or --rollouts")
    _refuse_unread(config)
    if config.endpoint:  # a bad port is found here, not after the model's load
        from nondet.probes.core.endpoint import parse_endpoint

        parse_endpoint(config.endpoint)
    if config.endpoint and config.rollouts:
        raise UsageError("give either --endpoint (a server samples) or --rollouts (exported samples), not both")
    if not config.rollouts and not all(isinstance(p, Chat) or p.strip() for p in config.prompts):
        raise UsageError("a prompt is empty; every line of --prompts needs text")


# sampler-side flags and the samplers that read them: batched generate calls, the continuous engine, a
# server (--endpoint), exported rollouts (nothing sampled here); given where not read, they are refused
SAMPLER_RULES = (
    ("--sampler-batch", "sampler_batch", ("batched",)),
    ("--max-new-tokens", "max_new_tokens", ("batched", "continuous", "endpoint")),
    ("--seed", "seed", ("batched", "continuous", "endpoint")),
    ("--no-exact-kl", "exact_kl", ("batched", "continuous")),  # only an in-process sampler keeps distributions
    ("--prompts", "prompts", ("batched", "continuous", "endpoint")),  # rollouts carry their own
)


def sampler_kind(config: RLConfig) -> str:
    """Which sampler a config runs: exported rollouts, a server, the continuous engine, or batched generate."""
    return ("rollouts" if config.rollouts else "endpoint" if config.endpoint else
            "continuous" if config.load == "continuous" else "batched")


SAMPLER_TEXT = {"rollouts": "--rollouts (nothing is sampled here)", "endpoint": "--endpoint (the server samples)",
                "continuous": "--load continuous (the engine batches every prompt at once)", "batched": "batched sampling"}


def _refuse_unread(config: RLConfig) -> None:
    sampler = sampler_kind(config)
    refuse_unread(config, SAMPLER_RULES, sampler, SAMPLER_TEXT[sampler])
