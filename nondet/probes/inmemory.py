"""The probe's sweep on a model already in memory: no loading, no run directory.

For the pytest plugin and notebooks: the same conditions, batches, replay and diff as
`run_probe`, on the caller's model and tokenizer objects. Streams stay in memory.
"""

from dataclasses import dataclass

from nondet.probes import conditions as cond
from nondet.probes.batch import tokenize_inputs
from nondet.probes.corpus import FILLERS
from nondet.probes.numerics import numerics_scope
from nondet.probes.probe import KERNEL_MODES, replay_condition, summarize_modes
from nondet.probes.replay import DecodeSettings


@dataclass(frozen=True)
class InMemoryProbe:
    prompt: str  # the target request
    batch_sizes: tuple[int, ...] = (1, 8, 16)  # 1 = the reference, always run
    max_new_tokens: int = 64  # greedy tokens per request
    kernels: tuple[str, ...] = ("default",)  # kernel modes, run in order
    placement: str = "ends"  # target rows: ends | first | last | all
    fillers: tuple[str, ...] = FILLERS  # texts of the other requests in each batch
    threads: int | None = None  # torch CPU threads (None = leave as is)


@dataclass
class InMemoryResult:
    summary: dict  # the same shape as summary.json
    streams: list[dict]  # the same records as streams.jsonl


def probe_model(model, tokenizer, probe: InMemoryProbe) -> InMemoryResult:
    """Replay probe.prompt under every condition of every kernels mode on (model, tokenizer)."""
    from nondet.errors import UsageError

    bad = [m for m in probe.kernels if m not in KERNEL_MODES]
    if bad:
        raise UsageError(f"kernels must be among {', '.join(KERNEL_MODES)}, not {bad[0]!r}")
    settings = DecodeSettings(probe.max_new_tokens, 0.0, 0)
    with numerics_scope(probe.threads):
        target, fillers = tokenize_inputs(tokenizer, probe.prompt, probe.fillers)
        streams: list[dict] = []
        for mode in probe.kernels:
            for condition in cond.plan_conditions(probe.batch_sizes, probe.placement, None, False, mode):
                streams += replay_condition(model, tokenizer, condition, target, fillers, settings, len(streams))
    return InMemoryResult(summarize_modes(streams, tokenizer), streams)
