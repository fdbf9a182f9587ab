"""`nondet probe` as a library call: ProbeConfig and the one probe loop over a source.

    plan the source's conditions -> for each: replay it, append every target stream the
    moment it arrives, then its condition record -> summarize -> summary.json

Sources (one per axis: static/source.py, continuous/source.py, server/source.py, ...) produce the
records, each behind the Source interface (core/source.py); the run directory's one writer
(rundir/writer.py) writes them, so a crash loses nothing already computed.
"""

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from nondet.errors import UsageError
from nondet.probes.core.corpus import FILLERS
from nondet.probes.core.kernel_coverage import census_entry, label_summary
from nondet.probes.core.saved_census import saved_census
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.core.load_config import validate as validate_load
from nondet.probes.core.numerics import numerics_scope
from nondet.probes.core.replay import KV_CACHES
from nondet.probes.core.source import Planned, Source
from nondet.probes.models.loading import ModelSpec
from nondet.probes.unread_flags import refuse_unread_flags, source_kind
from nondet.prompt import Chat, Prompt, as_prompt
from nondet.rundir import RunDir
from nondet.rundir.reader import read_fingerprint, read_streams
from nondet.rundir.records import to_json
from nondet.rundir.writer import RunWriter, new_header, refuse_a_used_run_dir

KERNEL_MODES = ("default", "batch-invariant")
DEFAULT_PROMPT = "Tell me about Richard Feynman"


@dataclass(frozen=True)
class ProbeConfig:
    # the target request: text, or a Chat (chat turns, always chat-formatted; nondet/prompt.py)
    prompt: Prompt = DEFAULT_PROMPT
    prompts: tuple[Prompt, ...] = ()  # several targets, each swept and diffed on its own (overrides prompt)
    model: ModelSpec = field(default_factory=ModelSpec)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)  # batch sizes swept; 1 = the reference
    # target rows: auto (rows with several prompts, else ends) | ends | first | last | all (every row a
    # copy) | rows (every row a target: prompts of equal token length share batches, no padding) |
    # padded (every row a target, all prompts left-padded together: a named condition); conditions.py
    placement: str = "auto"
    runs: int | None = None  # N target replays spread over the batches (None = placement)
    fillers: tuple[str, ...] = FILLERS  # texts of the other requests in the batch
    ragged: bool = False  # also run padded batches of unequal lengths (labelled "ragged")
    max_new_tokens: int = 200  # the default model's first flips come at tokens ~10-150
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # per-request generator seed when sampling
    # when sampling: per-request (each request its own generator seeded with `seed`: the fix) | shared (one
    # generator for the batch, rows drawn in order: transformers' batched sampling, a server ignoring seeds)
    sampler: str = "per-request"
    kernels: tuple[str, ...] = ("default",)  # kernel modes run in order ("--confirm" = both)
    threads: int | None = None  # torch CPU threads (None = torch's default); fingerprinted
    out: str | None = None  # run directory (None = nondet-runs/<time>-probe)
    argv: tuple[str, ...] = ()  # the command line, for "reproduce" in reports
    load: LoadConfig = field(default_factory=LoadConfig)  # static batches, continuous batching, or a server
    # speculative forms ("ngram:4", "self:4", "draft[:MODEL][:K]"): plain greedy vs each, at batch size 1
    # (transformers' assisted decoding takes one sequence; batch_sizes is then unused); () = none
    speculative: tuple[str, ...] = ()
    # static load: seconds the probe may take; the sweep is planned to fit from short timing
    # calls and what is left out is said in summary.json "budget" (probes/static/budget.py); None = all
    budget: float | None = None
    # tensor-parallel degrees (--tp 2 / --tp 1,2): static batches run by N worker processes per degree
    # (probes/tp/source.py); the smallest degree holds the reference; () = one process
    tp: tuple[int, ...] = ()
    # under the mode, row-parallel linears reduce K as one tree every degree of --tp follows, so the
    # degrees agree bit for bit (kernels/tp_tree.py); degrees must be powers of 2
    tp_invariant: bool = False
    # static load: the KV cache generate decodes with, dynamic | static (probes/core/replay.py
    # DecodeSettings); recorded in config.json, as every field is
    kv_cache: str = "dynamic"
    # static load: decode on the compiled path with this torch.compile backend ("inductor" from
    # --compile; "aot_eager" traces without Inductor, for tests), each kernels mode labelled with the
    # path it took (probes/core/compiled.py); None = eager
    compile_backend: str | None = None
    # static load on CUDA: eager kernels on a static KV cache, each decode step replayed from a CUDA graph
    # recorded once per batch shape (probes/core/captured.py; SGLang's default path); never with compile_backend
    cuda_graphs: bool = False
    # with batch-invariant kernels: run even where the op census finds ops the mode does not cover, the
    # run labelled "partly invariant" (probes/core/kernel_coverage.py); off: such a model is refused (exit 3)
    allow_uncovered: bool = False
    # in process: each plain-text prompt through the tokenizer's chat template (probes/core/chat.py), the ids
    # a server's /v1/chat/completions gives the model; a server load: load.chat sends messages instead.
    # A Chat prompt is chat-formatted with or without it
    chat: bool = False
    # the system message of chat-formatted plain-text prompts (None = the template's own default); a
    # Chat keeps its own messages
    system: str | None = None
    # the prefill axis (probes/core/prefill.py): forms "prefix:12" (the first 12 tokens' KV cache left by
    # an earlier request, the rest prefilled on top), "chunk:8" (prefill in chunks of 8), ":auto" sizes
    # from the prompt's length; each run alone (batch size 1) against the prompt's one-pass prefill
    prefill: tuple[str, ...] = ()
    # static load: every batch run this many times, each repeat with the fillers rotated (other requests in
    # the other rows), so the flip rate's interval rests on more runs; a server's --runs are its trials
    trials: int = 1
    # static load on the CPU, eager: the conditions decoded by this many processes at once, each with `threads`
    # torch threads (without --threads, the cores shared out); the run directory is one process's
    # (probes/static/workers.py); "auto": run_probe picks the number for this host (auto_workers.py)
    workers: int | str = 1
    # static load: each batched call stops once every target row's verdict against its reference is settled
    # under this rule ("identical", "max-logprob-diff = X", "min-divergence-step = S"; core/settled.py): the
    # gate's --fail-fast; the cut streams end "stopped". None = every call decodes max_new_tokens
    fail_fast: str | None = None

    def __post_init__(self) -> None:
        # prompts read back from config.json (a server probe's --resume) hold a Chat as {"messages": [...]}
        object.__setattr__(self, "prompt", as_prompt(self.prompt))
        object.__setattr__(self, "prompts", tuple(as_prompt(p) for p in self.prompts))

    @property
    def targets(self) -> tuple[Prompt, ...]:
        """The target prompts, in order; prompt_id indexes this."""
        return self.prompts or (self.prompt,)


@dataclass
class ProbeResult:
    run_dir: Path
    summary: dict  # summary.json contents
    seconds: float


OnCondition = Callable[[Planned, int, int], None]  # (condition, index, total), before it runs


def run_probe(config: ProbeConfig, on_condition: OnCondition | None = None, on_progress=None) -> ProbeResult:
    """Run the probe the config describes and write its run directory; on_progress: server request counts."""
    config = with_workers(with_chat_endpoint(config))
    validate_config(config)
    started = time.perf_counter()
    source = make_source(config, on_progress)
    try:
        with numerics_scope(config.threads):
            writer = _open(source, config)
            run_streams(source, writer, on_condition)
            streams = [to_json(s) for s in read_streams(writer.run_dir)]  # resumed ones included
            summary = writer.write_summary(label_summary(source.summarize(streams), read_fingerprint(writer.run_dir)))
    finally:
        source.close()
    return ProbeResult(writer.run_dir.path, summary, time.perf_counter() - started)


def run_streams(source: Source, writer: RunWriter | None, on_condition: OnCondition | None = None) -> list[dict]:
    """The one loop: every planned condition replayed, its streams and record handed to the writer
    (None: kept in memory only); returns the streams written, as on-disk dicts."""
    streams: list[dict] = []

    def emit(record) -> None:
        streams.append(writer.append_stream(record) if writer else to_json(record))

    try:
        plan = source.plan()
        for index, planned in enumerate(plan):
            if on_condition:
                on_condition(planned, index, len(plan))
            record = source.replay(planned, emit)
            if writer:
                writer.append_condition(record)
    except UsageError:  # refused once the model loaded (e.g. --trials with no filler row): where no condition
        if writer:      # ran yet, no run directory is left behind (discard_unstarted keeps one that has any)
            writer.discard_unstarted()
        raise
    return streams


def with_chat_endpoint(config: ProbeConfig) -> ProbeConfig:
    """A server probe of a Chat prompt goes to /v1/chat/completions (load.chat), --chat or not."""
    if config.load.mode != "server" or config.load.chat or not any(isinstance(p, Chat) for p in config.targets):
        return config
    return replace(config, load=replace(config.load, chat=True))


def with_workers(config: ProbeConfig) -> ProbeConfig:
    """--workers auto as this host's number (fingerprint.json's `workers`); then, without --threads, each
    process gets its share of the cores (recorded in config.json)."""
    from nondet.probes.static.auto_workers import auto_count
    from nondet.probes.static.workers import AUTO, threads_per_worker

    if config.workers == AUTO:
        config = replace(config, workers=auto_count(config))
    return replace(config, threads=threads_per_worker(config.threads, config.workers))


def make_source(config: ProbeConfig, on_progress=None) -> Source:
    """The source for the config's load (unread_flags.source_kind): static batches, continuous batching, a live
    server, a server's prefill, two servers compared (`load.against`), speculative decoding, or TP ranks."""
    kind = source_kind(config)
    if kind == "tp":
        from nondet.probes.tp.source import TensorParallelSource

        return TensorParallelSource(config)
    if kind == "server-prefix":
        from nondet.probes.server.prefix import PrefixServerSource

        return PrefixServerSource(config)
    if kind == "speculative":
        from nondet.probes.speculative.source import SpeculativeSource

        return SpeculativeSource(config)
    if kind == "continuous":
        from nondet.probes.continuous.source import ContinuousSource

        return ContinuousSource(config)
    if kind == "against":
        from nondet.probes.server.against import AgainstSource

        return AgainstSource(config, on_progress)
    if kind in ("server", "server-resume"):
        from nondet.probes.server.source import ServerSource

        return ServerSource(config, on_progress)
    from nondet.probes.static.source import StaticSource

    return StaticSource(config)


def _open(source: Source, config: ProbeConfig) -> RunWriter:
    """Open the source, then the run directory: a new one gets its header; a resumed one keeps it."""
    if not config.load.resume:  # before the model loads: refused in a second, not after minutes
        if config.load.mode == "server" and not config.prefill:  # the one source whose run can be finished later
            refuse_a_used_run_dir(config.out, f"finish it with --resume {config.out} or pass a new --out")
        else:
            refuse_a_used_run_dir(config.out)
    opened = source.open()
    writer = RunWriter(RunDir(opened.run_dir or config.out or default_run_dir("probe")))
    model = getattr(getattr(source, "loaded", None), "model", None)
    if opened.fingerprint is not None and model is not None and "batch-invariant" in config.kernels:
        # before any condition runs: a model the mode cannot cover is refused now, not after the default's
        compiled = bool(config.compile_backend)
        opened.fingerprint["census"] = census_entry(model, compiled, config.allow_uncovered,
                                                    saved_census(model, compiled))
    if opened.fingerprint is not None:
        writer.write_header(new_header("probe", asdict(config), config.argv), opened.fingerprint)
    source.attach(writer)
    return writer


def default_run_dir(command: str) -> str:
    """nondet-runs/<time>-<command>, with -2, -3... where a run of the same second has it."""
    base = Path("nondet-runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return str(path)


def validate_config(config: ProbeConfig) -> None:
    if not all(isinstance(p, Chat) or p.strip() for p in config.targets):
        raise UsageError("a prompt is empty; pass --prompt TEXT or --prompt-file FILE")
    if len(config.targets) > 1 and config.load.mode != "static":
        raise UsageError(f"--load {config.load.mode} probes one prompt; pass --prompt TEXT")
    if config.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be >= 1")
    if not (math.isfinite(config.temperature) and config.temperature >= 0):  # nan passes every comparison
        raise UsageError(f"--temperature must be a number >= 0 (0: greedy), not {config.temperature}")
    _validate_sampler(config)
    for mode in config.kernels:
        if mode not in KERNEL_MODES:
            raise UsageError(f"--kernels must be one of {', '.join(KERNEL_MODES)}, not {mode!r}")
    if not config.fillers:
        raise UsageError("no filler prompts: the fillers file is empty")
    validate_load(config.load, config.temperature)
    if config.budget is not None and not (math.isfinite(config.budget) and config.budget > 0):
        raise UsageError(f"--budget must be a number of seconds > 0, not {config.budget}")
    if config.budget is not None and (config.load.mode != "static" or config.speculative):
        raise UsageError("--budget plans static batches only: drop --load / --endpoint / --speculative")
    if config.speculative:
        _validate_speculative(config)
    if config.kv_cache not in KV_CACHES or (config.kv_cache != "dynamic" and config.load.mode != "static"):
        raise UsageError(f"--kv-cache must be one of {', '.join(KV_CACHES)} (static batches only), "
                         f"not {config.kv_cache!r}")
    if config.compile_backend and (config.load.mode != "static" or config.budget is not None):
        raise UsageError("--compile decodes static batches (in this process, or in --tp ranks); drop --load / "
                         "--endpoint / --budget")
    if config.cuda_graphs:
        _validate_cuda_graphs(config)
    if config.system and not config.chat:
        raise UsageError("--system is the system message of --chat prompts; add --chat")
    _validate_chat_prompts(config)
    if config.chat and config.load.mode == "static" and (config.speculative or config.tp):
        raise UsageError("--chat formats prompts for static batches and servers; drop --speculative / --tp")
    if config.chat and config.load.mode == "continuous":
        raise UsageError("--chat formats prompts for static batches and servers; drop --load continuous")
    if config.tp_invariant and (not config.tp or any(d & (d - 1) for d in config.tp)):
        raise UsageError("--tp-invariant needs --tp degrees that are powers of 2, e.g. --tp 1,2")
    if config.tp and min(config.tp) < 1:
        raise UsageError("--tp: every tensor-parallel degree must be an integer >= 1, e.g. --tp 1,2")
    if config.prefill:
        _validate_prefill(config)
    if config.trials < 1:
        raise UsageError(f"--trials must be >= 1, not {config.trials}")
    if config.trials > 1 and (config.load.mode != "static" or config.tp or config.speculative):
        raise UsageError("--trials repeats static batches (not --tp / --speculative); against a server or the "
                         "continuous engine --runs sets the number of replays under load")
    from nondet.probes.static import workers

    workers.validate(config)
    if config.fail_fast is not None:  # static batches only: refuse_unread_flags
        from nondet.probes.core.settled import StopRule

        StopRule.parse(config.fail_fast)
    if config.tp and (config.load.mode != "static" or config.speculative or config.budget is not None):
        raise UsageError("--tp runs static batches in worker processes; drop --load / --endpoint / --speculative / "
                         "--budget")
    refuse_unread_flags(config)  # last: the checks above say more where they apply


def _validate_chat_prompts(config: ProbeConfig) -> None:
    """Chat prompts ({"messages": [...]}) run where chat formatting exists: static batches and servers."""
    chats = sum(isinstance(p, Chat) for p in config.targets)
    if not chats:
        return
    if config.system and chats == len(config.targets):
        raise UsageError("--system is the system message of plain-text --chat prompts; every prompt here is "
                         "{\"messages\": [...]}: put the system message in its messages")
    if config.speculative or config.tp or config.load.mode == "continuous":
        raise UsageError("a {\"messages\": [...]} prompt runs on static batches and servers; speculative decoding, "
                         "--tp and --load continuous take plain-text prompts")


def _validate_speculative(config: ProbeConfig) -> None:
    from nondet.probes.speculative.speculation import parse_speculative

    parse_speculative(",".join(config.speculative))
    if config.load.mode != "static":
        raise UsageError(f"--speculative runs the model in process; drop --load {config.load.mode} / --endpoint")
    if config.temperature > 0:
        raise UsageError("--speculative compares greedy decoding; drop --temperature")
    if config.kv_cache != "dynamic" and not config.compile_backend:  # the eager rounds crop a dynamic cache
        raise UsageError("--speculative decodes eager on transformers' dynamic KV cache (a static one comes with "
                         "--compile); drop --kv-cache static or add --compile")
    if config.compile_backend:
        from nondet.probes.core.static_caches import refuse_compiled_speculation

        refuse_compiled_speculation()  # transformers before 5.24: now, before any model loads (probe and gate)


def _validate_cuda_graphs(config: ProbeConfig) -> None:
    """--cuda-graphs records the static batches' decode steps on a CUDA device, in this process."""
    if config.compile_backend:
        raise UsageError("--cuda-graphs and --compile are two decode paths (eager kernels recorded in CUDA graphs, "
                         "or Inductor's); pick one")
    if (config.load.mode != "static" or config.speculative or config.tp or config.budget is not None
            or config.prefill):
        raise UsageError("--cuda-graphs decodes static batches in this process; drop --load / --endpoint / "
                         "--speculative / --tp / --budget / --prefix-cache / --chunked-prefill")
    if not str(config.model.device).startswith("cuda"):
        raise UsageError("--cuda-graphs records decode steps on a CUDA device; add --device cuda")


def _validate_prefill(config: ProbeConfig) -> None:
    """The prefill axis runs in process on transformers' dynamic cache (eager): a compiled decode's
    static cache and the other sources build their caches themselves."""
    from nondet.probes.core.prefill import as_forms

    as_forms(config.prefill)
    if config.load.mode == "server":
        from nondet.probes.server.prefix import check_server_prefill

        check_server_prefill(config)
        return
    if (config.load.mode != "static" or config.speculative or config.tp or config.compile_backend
            or config.kv_cache != "dynamic" or config.budget is not None):
        raise UsageError("--prefix-cache / --chunked-prefill run in process with the dynamic KV cache; drop "
                         "--load / --endpoint / --speculative / --tp / --compile / --kv-cache / --budget")


def _validate_sampler(config: ProbeConfig) -> None:
    """--sampler picks how static batches sample (recorder.py); other sources sample their own way."""
    from nondet.probes.core.recorder import SAMPLERS

    if config.sampler not in SAMPLERS:
        raise UsageError(f"--sampler must be one of {', '.join(SAMPLERS)}, not {config.sampler!r}")
    if config.sampler != "per-request" and (config.temperature == 0 or config.load.mode != "static" or config.tp):
        raise UsageError("--sampler shared draws the samples of static batches from one generator; it needs "
                         "--temperature > 0 and no --load / --endpoint / --tp")
