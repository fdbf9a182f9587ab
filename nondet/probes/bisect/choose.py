"""Which run of a probe run directory to bisect: a divergent condition and one target row.

Default: the run whose tokens flip first (then: whose logprob bits differ first, the
smaller batch, the lower run id), preferring the default-kernels mode. `--condition`
takes a condition id ("default/bs8/ends") or its part after the mode ("bs8/ends"). Only
static batches (one generate call) and speculative conditions (one prompt, its rounds in
its stream) can be rebuilt exactly, so continuous-batching and server conditions are never
bisected.
"""

from dataclasses import dataclass

from nondet.errors import RunDirError, UsageError
from nondet.probes.core.conditions import Condition, condition_from_record

REPLAYABLE = ("static", "speculative")  # condition loads bisect can rebuild and replay


@dataclass(frozen=True)
class Target:
    condition: Condition  # the divergent condition, exactly as the probe ran it
    position: int  # the target row bisected (one of condition.positions)
    run_id: int  # its run id in streams.jsonl
    reference_run_id: int  # the reference run of the same kernels mode
    probe_flip_step: int | None  # the probe's first token divergence of that run
    probe_numeric_step: int | None  # the probe's first numeric divergence of that run
    prompt_id: int = 0  # which of the probe's prompts the run replays (config.json "prompts")


def choose_target(conditions: list[dict], summary: dict, where: str, wanted: str | None = None,
                  position: int | None = None) -> Target:
    by_id = {c["condition_id"]: c for c in conditions}
    runs = [(mode, r) for mode, m in summary["modes"].items() for r in m["runs"]]
    divergent = [(mode, r) for mode, r in runs if _diverges(r)]
    if wanted is not None:
        divergent = _only(wanted, divergent, by_id, where)
    divergent = _static(divergent, by_id, where)
    if position is not None:
        divergent = _at(position, divergent)
    if not divergent:
        raise RunDirError(f"{where}: no condition diverged from its reference (every run is bit-identical); "
                          "nothing to bisect")
    mode, run = min(divergent, key=lambda mr: _rank(mr, by_id))
    prompt_id = run.get("prompt_id", 0)
    return Target(_condition(by_id[run["condition_id"]]), run["position"], run["run_id"],
                  _reference_run_id(summary["modes"][mode], prompt_id), run["first_token_divergence"],
                  run["first_numeric_divergence"], prompt_id)


def _reference_run_id(mode: dict, prompt_id: int) -> int:
    """The reference run of the run's own prompt (a probe of several prompts has one per prompt)."""
    return next((p["reference_run_id"] for p in mode.get("prompts") or [] if p["prompt_id"] == prompt_id),
                mode["reference_run_id"])


def _diverges(run: dict) -> bool:
    return run["first_token_divergence"] is not None or run["first_numeric_divergence"] is not None


def _rank(mode_run: tuple[str, dict], by_id: dict) -> tuple:
    mode, r = mode_run
    flip, numeric = r["first_token_divergence"], r["first_numeric_divergence"]
    return (mode != "default", flip is None, flip or 0, numeric if numeric is not None else 0,
            by_id[r["condition_id"]]["batch_size"], r["run_id"])


def _only(wanted: str, divergent: list, by_id: dict, where: str) -> list:
    ids = [cid for cid in by_id if wanted in (cid, cid.split("/", 1)[-1])]
    choices = ", ".join(dict.fromkeys(r["condition_id"] for _, r in divergent)) or "none"
    if not ids:
        raise UsageError(f"--condition {wanted}: no such condition in {where}; divergent conditions: {choices}")
    picked = [(m, r) for m, r in divergent if r["condition_id"] in ids]
    if not picked:
        raise UsageError(f"--condition {wanted}: it did not diverge from the reference; "
                         f"divergent conditions: {choices}")
    return picked


def _static(divergent: list, by_id: dict, where: str) -> list:
    """Only static batches and speculative runs can be rebuilt and replayed; continuous / server runs cannot."""
    static = [(m, r) for m, r in divergent
              if by_id.get(r["condition_id"], {}).get("load", "static") in REPLAYABLE]
    if divergent and not static:
        loads = ", ".join(sorted({by_id.get(r["condition_id"], {}).get("load", "?") for _, r in divergent}))
        raise RunDirError(f"{where}: only {loads} conditions diverged; bisect replays static batches "
                          "(run `nondet probe` without --load / --endpoint, then bisect that run)")
    return static


def _at(position: int, divergent: list) -> list:
    picked = [(m, r) for m, r in divergent if r["position"] == position]
    if not picked:
        rows = ", ".join(sorted({str(r["position"]) for _, r in divergent})) or "none"
        raise UsageError(f"--position {position}: no divergent run at that row; divergent rows: {rows}")
    return picked


def _condition(record: dict) -> Condition:
    return condition_from_record(record)  # row_prompts included: a batch of several prompts rebuilds too
