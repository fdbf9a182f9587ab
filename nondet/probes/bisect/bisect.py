"""`nondet bisect` as a library call: attribute a probe's divergence to a point and op class.

Reads the probe's run directory (config.json reloads the same model, prompt, fillers and
decoding settings; summary.json names the divergent runs), replays the reference and one
divergent run in lockstep (lockstep.py; a speculative condition: speculative.py, one-token
decoding vs its verification rounds), writes bisect.json, bisect_modules.csv and
ablation.json back into the same directory (docs/run-directory.md).
"""

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nondet.errors import RunDirError
from nondet.probes.batch import Batch, build_batch, tokenize_inputs
from nondet.probes.bisect.ablation import Ablation, run_ablation
from nondet.probes.bisect.agreement import numeric_agreement
from nondet.probes.bisect.choose import Target, choose_target
from nondet.probes.bisect.classify import ablatable
from nondet.probes.bisect.lockstep import Lockstep, run_lockstep
from nondet.probes.bisect.speculative import speculative_part, speculative_replayer
from nondet.probes.conditions import Condition
from nondet.probes.loading import ModelSpec, load_model
from nondet.probes.numerics import numerics_scope
from nondet.probes.pieces import token_piece
from nondet.probes.replay import DecodeSettings
from nondet.rundir import RunDir
from nondet.rundir.files import CONFIG
from nondet.rundir.reader import read_condition_dicts, read_header_dict, read_stream_dicts, read_summary_dict
from nondet.rundir.writer import write_bisect

PROBE_KEYS = ("prompt", "model", "fillers", "max_new_tokens", "temperature", "seed")  # config.json keys read
MODULE_FIELDS = ["step", "order", "layer", "module", "op_class", "max_abs_diff", "max_rel_diff", "max_ulp",
                 "first_diff_index", "differs"]


@dataclass(frozen=True)
class BisectConfig:
    run_dir: str  # a probe's run directory: read, and written into
    condition: str | None = None  # condition id or its part after "<kernels>/"; None = the earliest flip
    position: int | None = None  # target row of that condition; None = its run that diverges first
    max_steps: int | None = None  # decode steps replayed; None = through the probe's flip step (or all)
    ablation: bool = True  # rerun per op class with batch-invariant kernels (the causal test)
    baseline: tuple[str, ...] = ()  # op classes invariant in EVERY replay (e.g. Thinking Machines' set:
    #                                 matmul, norm, softmax); bisect then attributes what remains


@dataclass
class BisectResult:
    run_dir: Path
    bisect: dict  # bisect.json contents (ablation included)
    modules: list[dict]  # bisect_modules.csv rows
    seconds: float


OnStage = Callable[[str], None]  # a short description of what runs now, for progress display


def run_bisect(config: BisectConfig, on_stage: OnStage | None = None) -> BisectResult:
    started = time.perf_counter()
    stage = on_stage or (lambda text: None)
    rd = RunDir(config.run_dir)
    conditions, summary, streams = _read_probe_results(rd)
    target = choose_target(conditions, summary, str(rd.path), config.condition, config.position)
    probe = _read_probe_config(rd)
    stage("loading model")
    loaded = load_model(ModelSpec(**probe["model"]))
    settings = DecodeSettings(replay_horizon(config, probe, target), probe["temperature"], probe["seed"])
    with numerics_scope(probe.get("threads")):
        replay = _replayer_of(loaded, probe, target, streams, settings, config.baseline)
        stage(f"lockstep replay of {target.condition.condition_id} row {target.position}")
        main = replay(None)
        ablation = _ablate(config, target, main, replay, stage, loaded.model)
    result = describe(target, main, loaded.tokenizer, ablation, config.baseline)
    result["reference_reproduced"] = _reproduced(main, streams, target.reference_run_id)
    if "router" in ablatable(loaded.model):  # a mixture of experts: routing before arithmetic
        result.update(routing=main.routing, routing_changes=main.routing_changes)
    if target.condition.load == "speculative":
        result["speculative"] = speculative_part(_stream(streams, target.run_id), main)
    result["seconds"] = round(time.perf_counter() - started, 2)
    rows = module_rows(main)
    write_result(rd, result, rows)
    return BisectResult(rd.path, result, rows, time.perf_counter() - started)


def replay_horizon(config: BisectConfig, probe: dict, target: Target) -> int:
    """Steps replayed: --max-steps, else through the probe's flip (nothing later is needed)."""
    if config.max_steps:
        return config.max_steps
    if target.probe_flip_step is not None:
        return min(probe["max_new_tokens"], target.probe_flip_step + 1)
    return probe["max_new_tokens"]


def _read_probe_results(rd: RunDir) -> tuple[list[dict], dict, list[dict]]:
    rd.require()
    return read_condition_dicts(rd), read_summary_dict(rd), read_stream_dicts(rd)


def _read_probe_config(rd: RunDir) -> dict:
    """The ProbeConfig fields of config.json (model, prompt, fillers, decoding settings)."""
    header = read_header_dict(rd)
    if header.get("command") != "probe" or "config" not in header:
        raise RunDirError(f"{rd.file(CONFIG)}: not written by `nondet probe`; bisect needs a probe run")
    missing = [k for k in PROBE_KEYS if k not in header["config"]]
    if missing:
        raise RunDirError(f"{rd.file(CONFIG)}: lacks {', '.join(missing)}; rerun `nondet probe`")
    return header["config"]


def _replayer_of(loaded, probe: dict, target: Target, streams: list[dict], settings: DecodeSettings,
                 baseline: tuple[str, ...]):
    """The replay of the target's condition: a static batch, or a speculative run's rounds."""
    mode = target.condition.kernels
    if target.condition.load == "speculative":
        prompt = _prompts(probe, loaded.tokenizer)[target.prompt_id]
        return speculative_replayer(loaded, prompt, _stream(streams, target.run_id), settings.max_new_tokens,
                                    lambda ops: kernel_scope(mode, baseline + (ops or ()), loaded.model))
    ref, div = _batches(loaded.tokenizer, probe, target)
    return _replayer(loaded, ref, div, target.position, settings, mode, baseline)


def _prompts(probe: dict, tokenizer) -> list[str]:
    """The probe's prompts as its model read them (several listed; chat-formatted under --chat)."""
    from nondet.probes.chat import model_texts

    return model_texts(tokenizer, probe.get("prompts") or [probe["prompt"]], probe.get("chat", False),
                       probe.get("system"))


def _stream(streams: list[dict], run_id: int) -> dict:
    return next(s for s in streams if s["run_id"] == run_id)


def _batches(tokenizer, probe: dict, target: Target) -> tuple[Batch, Batch]:
    """The reference (prompt alone) and the divergent batch exactly as the probe built it
    (all its target rows too: when sampling, each target samples with the probe's seed)."""
    texts = _prompts(probe, tokenizer)
    ids, fillers = tokenize_inputs(tokenizer, texts[target.prompt_id], probe["fillers"])
    pad = tokenizer.pad_token_id
    reference = build_batch(Condition("bisect/ref", target.condition.kernels, 1, (0,), "none"), ids, fillers, pad)
    every = [tokenize_inputs(tokenizer, t, probe["fillers"])[0] for t in texts] if target.condition.row_prompts else None
    return reference, build_batch(target.condition, ids, fillers, pad, prompts=every)


def _replayer(loaded, ref: Batch, div: Batch, row: int, settings: DecodeSettings, mode: str,
              baseline: tuple[str, ...]):
    """(op classes made invariant on top of the baseline or None, steps, stop at flip) -> Lockstep."""
    model, tokenizer = loaded.model, loaded.tokenizer

    def replay(ops: tuple[str, ...] | None, steps: int | None = None, stop_at_flip: bool = False) -> Lockstep:
        scope = kernel_scope(mode, baseline + (ops or ()), model)
        horizon = dataclasses.replace(settings, max_new_tokens=steps or settings.max_new_tokens)
        return run_lockstep(model, tokenizer, ref, div, horizon, scope, stop_at_flip, row=row)

    return replay


def kernel_scope(mode: str, ops: tuple[str, ...], model):
    """The kernels of one replay: the condition's mode, or exactly `ops` made batch-invariant.
    Uncovered ops are allowed: bisect claims nothing from the mode's label, only from the bits it
    compares (a probe run already refused, or labelled, a model the mode does not cover)."""
    from nondet.probes.sources.static import kernels_mode

    if not ops or mode != "default":
        return lambda: kernels_mode(mode, model, allow_uncovered=True)

    return lambda: kernels_mode("batch-invariant", model, set(ops), allow_uncovered=True)


def _ablate(config: BisectConfig, target: Target, main: Lockstep, replay, stage: OnStage,
            model) -> Ablation | None:
    if not config.ablation or target.condition.kernels != "default" or main.first_diff is None:
        return None
    from nondet.probes.bisect.classify import ablatable

    classes = tuple(c for c in ablatable(model) if c not in config.baseline)
    steps = main.steps if main.flip_step is None else main.flip_step + 1  # through the flip
    return run_ablation(lambda ops: replay(ops, steps, True), classes, main.first_diff,
                        lambda ops: stage(f"ablation: batch-invariant {' + '.join(ops)}"))


def describe(target: Target, ls: Lockstep, tokenizer, ablation: Ablation | None,
             baseline: tuple[str, ...] = ()) -> dict:
    """bisect.json (docs/run-directory.md) from one lockstep and its ablation."""
    flip = ls.flip_step
    return {
        "condition_id": target.condition.condition_id, "run_id": target.run_id,
        "reference_run_id": target.reference_run_id, "position": target.position,
        "batch_size": target.condition.batch_size, "prompt_id": target.prompt_id, "steps": ls.steps,
        "baseline": list(baseline),
        "origin": _origin(ls.first_diff),
        "first_numeric_step": ls.first_numeric_step,
        "lasting": ls.lasting,
        "transients": ls.transients,
        "probe_numeric_step": target.probe_numeric_step,
        "first_logprob_step": ls.first_logprob_step,
        "numeric_agreement": numeric_agreement(target.probe_numeric_step, ls.first_logprob_step, ls.first_diff,
                                               ls.lasting, ls.transients, ls.steps),
        "flip_step": flip,
        "margin_at_flip": None if flip is None else ls.reference[flip]["margin"],
        "flip_tokens": None if flip is None else _flip_tokens(ls, flip, tokenizer),
        "probe_flip_step": target.probe_flip_step,
        "amplification": ls.amplification,
        "ablation": [] if ablation is None else ablation.entries,
        "minimal_set": None if ablation is None else ablation.minimal_set,
    }


def _origin(first: dict | None) -> dict | None:
    if first is None:
        return None
    keys = ("step", "module", "op_class", "layer", "order", "max_abs_diff", "max_ulp", "first_diff_index")
    return {k: first[k] for k in keys}


def _flip_tokens(ls: Lockstep, flip: int, tokenizer) -> dict:
    ref, own = ls.reference[flip], ls.divergent[flip]
    return {"reference": ref["token"], "reference_piece": token_piece(tokenizer, ref["token"]),
            "divergent": own["token"], "divergent_piece": token_piece(tokenizer, own["token"]),
            "divergent_margin": own["margin"]}


def _reproduced(ls: Lockstep, streams: list[dict], reference_run_id: int) -> bool | None:
    """Do the replayed reference tokens equal the probe's reference stream (same numerics)?"""
    ref = next((s for s in streams if s["run_id"] == reference_run_id), None)
    if ref is None:
        return None
    probe_tokens = [s["token"] for s in ref["steps"]][: len(ls.reference)]
    return probe_tokens == [s["token"] for s in ls.reference][: len(probe_tokens)]


def module_rows(ls: Lockstep) -> list[dict]:
    """bisect_modules.csv: the kept steps (first numeric divergence, lasting divergence, flip), execution order."""
    return [{k: row[k] for k in MODULE_FIELDS} for step in sorted(ls.rows) for row in ls.rows[step]]


def write_result(rd: RunDir, result: dict, rows: list[dict]) -> None:
    write_bisect(rd, result, rows, MODULE_FIELDS)
