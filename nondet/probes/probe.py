"""`nondet probe` as a library call: replay one prompt under a sweep and diff the streams.

The model is loaded once; each condition is one batched generate call; every target
stream is appended to streams.jsonl as soon as its condition finishes, so a crash loses
nothing already computed. The summary (diff) is written at the end.
"""

import contextlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from nondet.errors import UsageError
from nondet.probes import conditions as cond
from nondet.probes.batch import build_batch, tokenize_inputs
from nondet.probes.corpus import FILLERS
from nondet.probes.diff import summarize, verdict
from nondet.probes.diff_prompts import merge_prompts
from nondet.probes.load.config import LoadConfig
from nondet.probes.load.config import validate as validate_load
from nondet.probes.loading import ModelSpec, load_model
from nondet.probes.numerics import fingerprint, numerics_scope
from nondet.probes.pieces import token_piece
from nondet.probes.replay import DecodeSettings, generate_condition
from nondet.rundir import RunDir

KERNEL_MODES = ("default", "batch-invariant")
DEFAULT_PROMPT = "Tell me about Richard Feynman"


@dataclass(frozen=True)
class ProbeConfig:
    prompt: str = DEFAULT_PROMPT  # the target request
    prompts: tuple[str, ...] = ()  # several targets, each swept and diffed on its own (overrides prompt)
    model: ModelSpec = field(default_factory=ModelSpec)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)  # batch sizes swept; 1 = the reference
    placement: str = "ends"  # target rows: ends | first | last | all (every row a copy)
    runs: int | None = None  # N target replays spread over the batches (None = placement)
    fillers: tuple[str, ...] = FILLERS  # texts of the other requests in the batch
    ragged: bool = False  # also run padded batches of unequal lengths (labelled "ragged")
    max_new_tokens: int = 200  # the default model's first flips come at tokens ~10-150
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # per-request generator seed when sampling
    kernels: tuple[str, ...] = ("default",)  # kernel modes run in order ("--confirm" = both)
    threads: int | None = None  # torch CPU threads (None = torch's default); fingerprinted
    out: str | None = None  # run directory (None = nondet-runs/<time>-probe)
    argv: tuple[str, ...] = ()  # the command line, for "reproduce" in reports
    load: LoadConfig = field(default_factory=LoadConfig)  # static batches, continuous batching, or a server


    @property
    def targets(self) -> tuple[str, ...]:
        """The target prompts, in order; prompt_id indexes this."""
        return self.prompts or (self.prompt,)


@dataclass
class ProbeResult:
    run_dir: Path
    summary: dict  # summary.json contents
    seconds: float


OnCondition = Callable[[cond.Condition, int, int], None]  # (condition, index, total)


def run_probe(config: ProbeConfig, on_condition: OnCondition | None = None) -> ProbeResult:
    _validate(config)
    if config.load.mode != "static":
        return _run_under_load(config, on_condition)
    started = time.perf_counter()
    run_dir = RunDir(config.out or default_run_dir("probe"))
    loaded = load_model(config.model)
    with numerics_scope(config.threads):
        inputs = [tokenize_inputs(loaded.tokenizer, p, config.fillers) for p in config.targets]
        _write_header(run_dir, config, loaded.description)
        streams = _replay_all(loaded, plan_all(config), inputs, config, run_dir, on_condition)
    summary = summarize_modes(streams, loaded.tokenizer, config.targets)
    run_dir.write_json("summary.json", summary)
    return ProbeResult(run_dir.path, summary, time.perf_counter() - started)


def plan_all(config: ProbeConfig) -> list[cond.Condition]:
    """Every condition of the run: per kernels mode, per prompt, the reference then the batches."""
    several = len(config.targets) > 1
    return [c for mode in config.kernels for k in range(len(config.targets)) for c in cond.plan_conditions(
        config.batch_sizes, config.placement, config.runs, config.ragged, mode, k, several)]


def _run_under_load(config: ProbeConfig, on_condition: OnCondition | None) -> ProbeResult:
    if config.load.mode == "continuous":
        from nondet.probes.load.continuous import run_continuous

        return run_continuous(config, on_condition)
    from nondet.probes.load.server_probe import run_server_probe

    return run_server_probe(config)


def summarize_modes(streams: list[dict], tokenizer=None, prompts: tuple[str, ...] = ()) -> dict:
    """The diff per kernels mode; with several prompts, per prompt first, then merged."""
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None
    modes = {}
    for mode in dict.fromkeys(s["kernels"] for s in streams):
        of_mode = [s for s in streams if s["kernels"] == mode]
        prompt_ids = list(dict.fromkeys(s.get("prompt_id", 0) for s in of_mode))
        per_prompt = [summarize([s for s in of_mode if s.get("prompt_id", 0) == k], decode) for k in prompt_ids]
        modes[mode] = per_prompt[0] if len(per_prompt) == 1 else merge_prompts(per_prompt, prompt_ids, prompts)
    return {"modes": modes, "verdict": verdict(modes)}


def default_run_dir(command: str) -> str:
    return str(Path("nondet-runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}")


def _validate(config: ProbeConfig) -> None:
    if not all(p.strip() for p in config.targets):
        raise UsageError("a prompt is empty; pass --prompt TEXT or --prompt-file FILE")
    if len(config.targets) > 1 and config.load.mode != "static":
        raise UsageError(f"--load {config.load.mode} probes one prompt; pass --prompt TEXT")
    if config.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be >= 1")
    if config.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    for mode in config.kernels:
        if mode not in KERNEL_MODES:
            raise UsageError(f"--kernels must be one of {', '.join(KERNEL_MODES)}, not {mode!r}")
    if not config.fillers:
        raise UsageError("no filler prompts: the fillers file is empty")
    validate_load(config.load, config.temperature)


def _write_header(run_dir: RunDir, config: ProbeConfig, description: dict) -> None:
    run_dir.path.mkdir(parents=True, exist_ok=True)
    from nondet import __version__

    run_dir.write_json("config.json", {"command": "probe", "argv": list(config.argv),
                                       "config": asdict(config), "nondet_version": __version__})
    run_dir.write_json("fingerprint.json", fingerprint(description, ",".join(config.kernels)))


def _replay_all(loaded, plans, inputs, config, run_dir, on_condition) -> list[dict]:
    """inputs[k]: (target ids, filler ids) of prompt k."""
    settings = DecodeSettings(config.max_new_tokens, config.temperature, config.seed)
    streams: list[dict] = []
    for index, condition in enumerate(plans):
        if on_condition:
            on_condition(condition, index, len(plans))
        run_dir.append_jsonl("conditions.jsonl", condition.to_json())
        target, fillers = inputs[condition.prompt_id]
        for stream in replay_condition(loaded.model, loaded.tokenizer, condition, target, fillers, settings,
                                       first_run_id=len(streams)):
            run_dir.append_jsonl("streams.jsonl", stream)
            streams.append(stream)
    return streams


def replay_condition(model, tokenizer, condition: cond.Condition, target: list[int], fillers: list[list[int]],
                     settings: DecodeSettings, first_run_id: int) -> list[dict]:
    """One condition: build its batch, generate under its kernels, one stream record per target row."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = build_batch(condition, target, fillers, pad_id or 0)
    with kernels_mode(condition.kernels, model):
        rows = generate_condition(model, tokenizer, batch, settings)
    return [_stream_record(first_run_id + i, condition, row, steps, len(target), tokenizer)
            for i, (row, steps) in enumerate(rows.items())]


def kernels_mode(mode: str, model):
    """The batch-invariant mode around a call, or nothing for the default kernels."""
    if mode == "default":
        return contextlib.nullcontext()
    from nondet.kernels import batch_invariant

    return batch_invariant(model=model)


def _stream_record(run_id, condition, row, steps, prompt_tokens, tokenizer) -> dict:
    for step in steps:
        step["piece"] = token_piece(tokenizer, step["token"])
    tokens = [s["token"] for s in steps]
    return {
        "run_id": run_id, "condition_id": condition.condition_id, "kernels": condition.kernels,
        "position": row, "is_reference": condition.is_reference, "prompt_tokens": prompt_tokens,
        "prompt_id": condition.prompt_id,
        "finish": "length" if len(steps) else "empty", "text": tokenizer.decode(tokens),
        "steps": steps,
    }
