"""The load settings of a probe: static batches, continuous batching in process, or a server.

Kept apart from ProbeConfig's other fields so the static probe's API stays as it was; it is
one field of ProbeConfig (`config.load`) and lands in config.json with the rest.
"""

import math
from dataclasses import dataclass

from nondet.errors import UsageError

LOAD_MODES = ("static", "continuous", "server")


@dataclass(frozen=True)
class LoadConfig:
    mode: str = "static"  # static | continuous | server (server = --endpoint given)
    # continuous: mean filler arrivals per engine step (Poisson); server: filler requests
    # per second (Poisson). Per step in process so a seed fixes the batch at every step.
    rate: float | None = None  # None = 0.5 per step (continuous) / 4 per second (server)
    concurrency: int | None = None  # continuous: fillers in the engine at once (default 8);
    #                                 server: target copies in flight at once (default all)
    filler_requests: int | None = None  # fillers per run (continuous, default 24) / in all (server, default 2 x runs)
    endpoint: str | None = None  # base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000
    against: str | None = None  # a second deployment of the model to compare with endpoint (server/against.py)
    chat: bool = False  # /v1/chat/completions instead of /v1/completions
    tokenizer: str | None = None  # local tokenizer for text-level comparison (dir or hub id)
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable, never stored
    timeout: float = 600.0  # seconds one HTTP request may take before it counts as hung (not retried)
    retries: int = 2  # extra attempts after a connection error, HTTP 429 or 5xx
    resume: str | None = None  # run directory of an interrupted server probe to finish

    def resolved_rate(self) -> float:
        return self.rate if self.rate is not None else (0.5 if self.mode == "continuous" else 4.0)


def validate(load: LoadConfig, temperature: float) -> None:
    if load.mode not in LOAD_MODES:
        raise UsageError(f"--load must be one of static, continuous, not {load.mode!r}")
    if load.rate is not None and not _positive(load.rate):
        raise UsageError(f"--rate must be a number > 0, not {load.rate}")
    if load.concurrency is not None and load.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, not {load.concurrency}")
    if load.filler_requests is not None and load.filler_requests < 0:
        raise UsageError(f"--filler-requests must be >= 0, not {load.filler_requests}")
    if not _positive(load.timeout):
        raise UsageError(f"--timeout must be a number of seconds > 0, not {load.timeout}")
    if load.mode == "continuous" and temperature > 0:
        raise UsageError("--load continuous replays greedy decoding only; drop --temperature")
    if load.mode == "server" and not (load.endpoint or load.resume):
        raise UsageError("the server load needs --endpoint URL")
    if load.against is not None and (not load.endpoint or load.resume):
        raise UsageError("--against URL_B compares with --endpoint URL_A: give --endpoint, and no --resume "
                         "(an --against probe is rerun, not resumed)")
    _validate_urls(load)


def _positive(value: float) -> bool:
    """> 0 and finite: nan passes every `<=` test, and an infinite rate or timeout is no setting a socket or a
    Poisson process can take."""
    return math.isfinite(value) and value > 0


def _validate_urls(load: LoadConfig) -> None:
    """Checked here, not on the first connection: a bad port was an internal error once the run had begun."""
    from nondet.probes.core.endpoint import parse_endpoint, refuse_same_deployment

    if load.endpoint is not None:
        parse_endpoint(load.endpoint, "--endpoint")
    if load.against is not None:
        parse_endpoint(load.against, "--against")
        refuse_same_deployment(load.endpoint, load.against)
