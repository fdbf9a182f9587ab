"""What every bisect shares: its settings and result, the kernels of a replay, bisect.json.

`nondet bisect` replays a reference and a divergent computation in lockstep (lockstep.py) and
ablates per op class (ablation.py). The replays differ per axis: a probe run's static batch
(probes/static/bisect.py) or speculative rounds (probes/speculative/bisect.py), chosen by
probes/bisect_probe.py; a tensor-parallel run at its degree (probes/tp/bisect.py); an rl run's
sampler against its trainer (probes/rl/bisect.py). Each describes its lockstep here and writes
bisect.json, bisect_modules.csv and ablation.json through nondet.rundir (docs/run-directory.md).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nondet.errors import RunDirError
from nondet.probes.bisect.ablation import Ablation
from nondet.probes.bisect.agreement import numeric_agreement
from nondet.probes.bisect.choose import Target
from nondet.probes.bisect.lockstep import Lockstep
from nondet.probes.core.kernels_mode import kernels_mode
from nondet.probes.core.pieces import token_piece
from nondet.rundir import RunDir
from nondet.rundir.writer import write_bisect

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


def replay_horizon(config: BisectConfig, probe: dict, target: Target) -> int:
    """Steps replayed: --max-steps, else through the probe's flip (nothing later is needed)."""
    if config.max_steps:
        return config.max_steps
    if target.probe_flip_step is not None:
        return min(probe["max_new_tokens"], target.probe_flip_step + 1)
    return probe["max_new_tokens"]


def replay_cache(probe: dict) -> dict:
    """DecodeSettings fields of the KV cache a probe's run decoded on. A static one (`--kv-cache static`,
    `--cuda-graphs`, `--compile`) is replayed on a static cache of the probe's length, prompt + its
    max_new_tokens, however few steps the replay takes: a cache's layout can be part of the numbers (on the 2-core
    EPYC the random demo's fp32 reference took other bits on the dynamic cache than on the static one; on an
    H200 the GPU case's did not, nor with a static cache of the replay's own length: docs/benchmarks.md,
    2026-11-30), and a replay must not depend on it. The replay itself is eager (the hooks
    need the modules to run), so a compiled run's bits are Inductor's and not reproduced; a CUDA-graph run's
    kernels are eager ones, and are."""
    if probe.get("kv_cache") == "static" or probe.get("cuda_graphs") or probe.get("compile_backend"):
        return {"kv_cache": "static", "cache_tokens": probe["max_new_tokens"]}
    return {}


def kernel_scope(mode: str, ops: tuple[str, ...], model):
    """The kernels of one replay: the condition's mode, or exactly `ops` made batch-invariant.
    Uncovered ops are allowed: bisect claims nothing from the mode's label, only from the bits it
    compares (a probe run already refused, or labelled, a model the mode does not cover)."""
    if not ops or mode != "default":
        return lambda: kernels_mode(mode, model, allow_uncovered=True)

    return lambda: kernels_mode("batch-invariant", model, set(ops), allow_uncovered=True)


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


def module_rows(ls: Lockstep) -> list[dict]:
    """bisect_modules.csv: the kept steps (first numeric divergence, lasting divergence, flip), execution order."""
    return [{k: row[k] for k in MODULE_FIELDS} for step in sorted(ls.rows) for row in ls.rows[step]]


class ResultNotSaved(RunDirError):
    """The replay finished but its files could not be written (a disk filled, the directory turned
    read-only): the result travels with the error, so the CLI shows it instead of losing minutes of replay."""

    def __init__(self, message: str, result: BisectResult) -> None:
        super().__init__(message)
        self.result = result


def write_result(rd: RunDir, result: dict, rows: list[dict]) -> None:
    try:
        write_bisect(rd, result, rows, MODULE_FIELDS)
    except OSError as exc:
        raise ResultNotSaved(f"cannot write bisect's result into {rd.path}: {exc.strerror or exc}",
                             BisectResult(rd.path, result, rows, result.get("seconds", 0.0))) from exc
