"""`nondet bisect` of a probe run as a library call: attribute its divergence to a point and op class.

Reads the probe's run directory (config.json reloads the same model, prompt, fillers and
decoding settings; summary.json names the divergent runs), replays the reference and one
divergent run in lockstep (a static batch: probes/static/bisect.py; a speculative condition:
probes/speculative/bisect.py, one-token decoding vs its verification rounds), ablates per op
class, and writes bisect.json, bisect_modules.csv and ablation.json back into the same
directory (docs/run-directory.md). It sits at the probes root beside probe.py because, like the
probe, it picks an axis by the run it reads; the shared machinery is probes/bisect/.
"""

import time

from nondet.errors import RunDirError
from nondet.probes.bisect.ablation import Ablation, run_ablation
from nondet.probes.bisect.bisect import (BisectConfig, BisectResult, OnStage, describe, kernel_scope, module_rows,
                                        replay_cache, replay_horizon, write_result)
from nondet.probes.bisect.choose import Target, choose_target
from nondet.probes.bisect.classify import ablatable
from nondet.probes.bisect.lockstep import Lockstep
from nondet.probes.bisect.reproduced import replay_record, reproduced
from nondet.probes.core.numerics import numerics_scope
from nondet.probes.core.replay import DecodeSettings
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.speculative.bisect import speculative_part, speculative_replayer
from nondet.probes.static.bisect import probed_prompts, static_replayer
from nondet.rundir import RunDir
from nondet.rundir.files import CONFIG
from nondet.rundir.reader import read_condition_dicts, read_header_dict, read_stream_dicts, read_summary_dict

PROBE_KEYS = ("prompt", "model", "fillers", "max_new_tokens", "temperature", "seed")  # config.json keys read


def run_bisect(config: BisectConfig, on_stage: OnStage | None = None) -> BisectResult:
    started = time.perf_counter()
    stage = on_stage or (lambda text: None)
    rd = RunDir(config.run_dir)
    conditions, summary, streams = _read_probe_results(rd)
    target = choose_target(conditions, summary, str(rd.path), config.condition, config.position)
    probe = _read_probe_config(rd)
    stage("loading model")
    loaded = load_model(ModelSpec(**probe["model"]))
    cache = replay_cache(probe) if target.condition.load != "speculative" else {}  # speculative rounds: their own
    settings = DecodeSettings(replay_horizon(config, probe, target), probe["temperature"], probe["seed"],
                              sampler=probe.get("sampler", "per-request"), **cache)
    with numerics_scope(probe.get("threads")):
        replay = _replayer_of(loaded, probe, target, streams, settings, config.baseline)
        stage(f"lockstep replay of {target.condition.condition_id} row {target.position}")
        main = replay(None)
        ablation = _ablate(config, target, main, replay, stage, loaded.model)
    result = describe(target, main, loaded.tokenizer, ablation, config.baseline)
    result.update(reproduced(main.reference, streams, target.reference_run_id))
    result["replay"] = replay_record(settings, probe)
    if "router" in ablatable(loaded.model):  # a mixture of experts: routing before arithmetic
        result.update(routing=main.routing, routing_changes=main.routing_changes)
    if target.condition.load == "speculative":
        result["speculative"] = speculative_part(_stream(streams, target.run_id), main)
    result["seconds"] = round(time.perf_counter() - started, 2)
    rows = module_rows(main)
    write_result(rd, result, rows)
    return BisectResult(rd.path, result, rows, time.perf_counter() - started)


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
        prompt = probed_prompts(probe, loaded.tokenizer, streams)[0][target.prompt_id]
        return speculative_replayer(loaded, prompt, _stream(streams, target.run_id), settings.max_new_tokens,
                                    lambda ops: kernel_scope(mode, baseline + (ops or ()), loaded.model))
    return static_replayer(loaded, probe, target, streams, settings, baseline)


def _stream(streams: list[dict], run_id: int) -> dict:
    return next(s for s in streams if s["run_id"] == run_id)


def _ablate(config: BisectConfig, target: Target, main: Lockstep, replay, stage: OnStage,
            model) -> Ablation | None:
    if not config.ablation or target.condition.kernels != "default" or main.first_diff is None:
        return None
    from nondet.probes.bisect.classify import ablatable

    classes = tuple(c for c in ablatable(model) if c not in config.baseline)
    steps = main.steps if main.flip_step is None else main.flip_step + 1  # through the flip
    return run_ablation(lambda ops: replay(ops, steps, True), classes, main.first_diff,
                        lambda ops: stage(f"ablation: batch-invariant {' + '.join(ops)}"))

