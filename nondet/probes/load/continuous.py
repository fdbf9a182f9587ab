"""`nondet probe --load continuous`: the target inside transformers' continuous-batching engine.

Per kernels mode: the reference (the target alone in the engine), then `runs` replays of the
target while fillers arrive as a seeded Poisson process, `rate` arrivals per engine step on
average, at most `concurrency` fillers in the engine at once, `filler_requests` in all. The
target joins at a seeded step, so it meets the batch mid-flight: requests join and leave
around it at every step. One engine condition per run; run r uses the same arrival pattern
in every kernels mode. Each run's condition and stream are appended as soon as it finishes.
"""

import contextlib
import math
import time
from dataclasses import dataclass

from nondet.probes.load import arrivals
from nondet.probes.load.engine import ContinuousEngine, EngineSettings
from nondet.rundir import RunDir

DEFAULT_RUNS = 8  # replays under load, besides the reference
DEFAULT_CONCURRENCY = 8
DEFAULT_FILLERS = 24
ATTENTION_NOTE = ("batch-invariant kernels under --load continuous cover matmul, norm and softmax only: the engine's "
                  "{impl} attention path (paged, packed, possibly CUDA-graphed) cannot take nondet's attention "
                  "kernel; invariance is not claimed for attention")
INVARIANT_NOTE = ("batch-invariant kernels under --load continuous: matmul, norm and softmax through nondet's "
                  "kernels; attention per request with nondet's kernel over the engine's paged KV cache "
                  "(CUDA graphs and the switch to flash attention are off in this probe, for both kernel modes)")


@dataclass(frozen=True)
class Progress:
    kernels: str
    label: str


def run_continuous(config, on_condition=None):
    from nondet.probes.batch import tokenize_inputs
    from nondet.probes.loading import load_model
    from nondet.probes.numerics import numerics_scope
    from nondet.probes.probe import ProbeResult, default_run_dir, summarize_modes

    started = time.perf_counter()
    run_dir = RunDir(config.out or default_run_dir("probe"))
    loaded = load_model(config.model)
    with numerics_scope(config.threads):
        target, fillers = tokenize_inputs(loaded.tokenizer, config.prompt, config.fillers)
        engine = ContinuousEngine(loaded.model, _settings(config, loaded, target, fillers))
        try:
            _write_header(run_dir, config, loaded.description, engine)
            streams = _replay_modes(engine, loaded, target, fillers, config, run_dir, on_condition)
        finally:
            engine.close()
    summary = summarize_modes(streams, loaded.tokenizer)
    summary["load"] = load_summary(config, engine)
    run_dir.write_json("summary.json", summary)
    return ProbeResult(run_dir.path, summary, time.perf_counter() - started)


def load_summary(config, engine: ContinuousEngine) -> dict:
    load, attn_implementation = config.load, engine.attn_implementation
    notes = []
    if "batch-invariant" in config.kernels:
        notes.append(INVARIANT_NOTE if engine.invariant_attention_ok else ATTENTION_NOTE.format(impl=attn_implementation))
    return {"mode": "continuous", "compare_level": "logits", "runs": _runs(config),
            "rate": load.resolved_rate(), "rate_unit": "filler arrivals per engine step (Poisson)",
            "concurrency": _concurrency(config), "filler_requests": _filler_count(config),
            "attn_implementation": attn_implementation, "notes": notes}


def _settings(config, loaded, target, fillers) -> EngineSettings:
    from nondet.probes.replay import eos_ids

    longest = max(map(len, fillers + [target])) + 2 * config.max_new_tokens
    return EngineSettings(config.max_new_tokens, tuple(eos_ids(loaded.model, loaded.tokenizer)),
                          max_requests=_concurrency(config) + 1, max_len=longest,
                          max_batch_tokens=max(512, 2 * len(target)), plain="batch-invariant" in config.kernels)


def _write_header(run_dir: RunDir, config, description: dict, engine: ContinuousEngine) -> None:
    from dataclasses import asdict

    from nondet import __version__
    from nondet.probes.numerics import fingerprint

    run_dir.path.mkdir(parents=True, exist_ok=True)
    run_dir.write_json("config.json", {"command": "probe", "argv": list(config.argv),
                                       "config": asdict(config), "nondet_version": __version__})
    fp = fingerprint(description, ",".join(config.kernels))
    fp["load"] = {"mode": "continuous", "engine": "transformers ContinuousBatchingManager, stepped in process",
                  "attn_implementation": engine.attn_implementation, "page_size": engine.settings.page_size,
                  "max_batch_tokens": engine.settings.max_batch_tokens}
    run_dir.write_json("fingerprint.json", fp)


@contextlib.contextmanager
def engine_kernels(mode: str, engine: ContinuousEngine):
    """The kernels mode inside the engine: nondet's batch-invariant ops for matmul, norm and softmax
    (aten overrides) and, where the engine's path allows it, cb_attention for attention."""
    if mode == "default":
        yield
        return
    from nondet.kernels import OP_CLASSES, batch_invariant
    from nondet.probes.load.cb_attention import invariant_attention

    attention = invariant_attention(engine.model) if engine.invariant_attention_ok else contextlib.nullcontext()
    with batch_invariant(ops=[op for op in OP_CLASSES if op != "attention"]), attention:
        yield


def _replay_modes(engine, loaded, target, fillers, config, run_dir, on_condition) -> list[dict]:
    streams: list[dict] = []
    total = len(config.kernels) * (_runs(config) + 1)
    for mode in config.kernels:
        for run in range(_runs(config) + 1):
            plan = _plan(config, run, len(fillers))
            if on_condition:
                on_condition(Progress(mode, plan["label"]), len(streams), total)
            with engine_kernels(mode, engine):
                trace = engine.run(target, plan["target_step"], plan["schedule"], fillers, _concurrency(config))
            streams.append(_record(run_dir, mode, run, plan, trace, len(streams), len(target), loaded.tokenizer))
    return streams


def _plan(config, run: int, n_texts: int) -> dict:
    """Run 0 is the reference (alone); run r >= 1 draws its arrival pattern from (seed, r)."""
    if run == 0:
        return {"target_step": 0, "schedule": [], "label": "alone (reference)"}
    rng = arrivals.run_rng(config.seed, run)
    rate, concurrency = config.load.resolved_rate(), _concurrency(config)
    # Filler lengths uniform in [1, 2 x the target's]: they finish before, with and after it.
    schedule = arrivals.per_step(rng, rate, _filler_count(config), n_texts, 2 * config.max_new_tokens)
    target_step = rng.randint(0, math.ceil(concurrency / rate))  # the batch is filling up, or full
    return {"target_step": target_step, "schedule": schedule,
            "label": f"run {run}: {rate:g} fillers/step, <= {concurrency} at once, target at step {target_step}"}


def _record(run_dir: RunDir, mode: str, run: int, plan: dict, trace, run_id: int, prompt_tokens: int,
            tokenizer) -> dict:
    condition = {
        "condition_id": f"{mode}/cb/{'ref' if run == 0 else f'run{run}'}", "kernels": mode, "load": "continuous",
        "batch_size": max(trace.batch_requests, default=1), "positions": [trace.position or 0],
        "fillers": "none" if run == 0 else "poisson", "label": plan["label"],
        "target_step": plan["target_step"], "filler_arrivals": len(plan["schedule"]),
    }
    run_dir.append_jsonl("conditions.jsonl", condition)
    from nondet.probes.pieces import token_piece

    for step in trace.steps:
        step["piece"] = token_piece(tokenizer, step["token"])
    tokens = [s["token"] for s in trace.steps]
    stream = {
        "run_id": run_id, "condition_id": condition["condition_id"], "kernels": mode,
        "position": trace.position or 0, "is_reference": run == 0, "prompt_tokens": prompt_tokens,
        "finish": "length" if tokens else "empty", "text": tokenizer.decode(tokens), "steps": trace.steps,
        "load": "continuous", "engine_steps": trace.engine_steps,
        "batch_requests": trace.batch_requests, "batch_tokens": trace.batch_tokens,
    }
    run_dir.append_jsonl("streams.jsonl", stream)
    return stream


def _runs(config) -> int:
    return config.runs if config.runs is not None else DEFAULT_RUNS


def _concurrency(config) -> int:
    return config.load.concurrency or DEFAULT_CONCURRENCY


def _filler_count(config) -> int:
    return config.load.filler_requests if config.load.filler_requests is not None else DEFAULT_FILLERS
