"""The probe on a model already in memory: no loading, no run directory.

For the pytest plugin and notebooks: the static source and the probe loop of `run_probe`,
on the caller's model and tokenizer objects. Streams stay in memory.
"""

from dataclasses import dataclass, replace

from nondet.probes.core.numerics import numerics_scope
from nondet.probes.models.loading import LoadedModel
from nondet.probes.probe import ProbeConfig, run_streams, validate_config
from nondet.probes.static.source import StaticSource
from nondet.probes.static.workers import AUTO


@dataclass
class InMemoryResult:
    summary: dict  # the same shape as summary.json
    streams: list[dict]  # the same records as streams.jsonl


def probe_model(model, tokenizer, config: ProbeConfig) -> InMemoryResult:
    """Replay config's prompts under every condition of every kernels mode on (model, tokenizer).
    config.model, .out and .load are not used: the model is given and nothing is written. --workers is
    refused (auto is 1 here): a helper process loads its model from config.model, which is not this one."""
    if config.workers == AUTO:
        config = replace(config, workers=1)
    validate_config(config)
    if config.workers > 1:
        from nondet.errors import UsageError

        raise UsageError("--workers loads the model in every process; a model handed over in memory runs in this "
                         "one: drop workers")
    source = StaticSource(config, LoadedModel(model, tokenizer, description={}))
    with numerics_scope(config.threads):
        source.open()
        streams = run_streams(source, None)
    summary = source.summarize(streams)
    return InMemoryResult({"modes": summary.modes, "verdict": summary.verdict, **summary.extra}, streams)
