"""Which run of a probe run directory to bisect: a divergent condition and one target row.

Default: the run whose tokens flip first (then: whose logprob bits differ first, the
smaller batch, the lower run id), preferring the default-kernels mode. `--condition`
takes a condition id ("default/bs8/ends") or its part after the mode ("bs8/ends"). Only
static batches (one generate call) and speculative conditions (one prompt, its rounds in
its stream) can be rebuilt exactly, so continuous-batching and server conditions are never
bisected.
"""

from dataclasses import dataclass
from pathlib import Path

from nondet.errors import NothingToBisect, RunDirError, UsageError
from nondet.probes.core.conditions import Condition, condition_from_record
from nondet.rundir.files import CONDITIONS, SUMMARY
from nondet.rundir.shapes import DICT, INT, LIST, OPT_INT, STR, check_fields

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
    runs = [(mode, r) for mode, m in _modes(summary, where).items() for r in m["runs"]]
    divergent = [(mode, r) for mode, r in runs if _diverges(r)]
    _require_conditions(divergent, by_id, where)
    if wanted is not None:
        divergent = _only(wanted, divergent, by_id, where)
    divergent = _static(divergent, by_id, where)
    if position is not None:
        divergent = _at(position, divergent)
    if not divergent:
        raise NothingToBisect(f"{where}: no condition diverged from its reference (every run is bit-identical)")
    mode, run = min(divergent, key=lambda mr: _rank(mr, by_id))
    prompt_id = run.get("prompt_id", 0)
    return Target(_condition(by_id[run["condition_id"]]), run["position"], run["run_id"],
                  _reference_run_id(summary["modes"][mode], prompt_id, f"{_summary(where)}, mode {mode!r}"),
                  run["first_token_divergence"], run["first_numeric_divergence"], prompt_id)


def _modes(summary, where: str) -> dict:
    """summary.json's modes, checked as far as the choice reads them, with the reader's own checks: valid
    JSON of the wrong shape (a list, a run without its run_id) is exit 4 naming the field, as in `nondet
    report`, not an internal error."""
    check_fields(_summary(where), summary, {"modes": DICT}, {})
    for name, mode in summary["modes"].items():
        at = f"{_summary(where)}, mode {name!r}"
        check_fields(at, mode, {"runs": LIST}, {"reference_run_id": INT, "prompts": LIST})
        for i, run in enumerate(mode["runs"]):
            check_fields(f"{at}, run {i}", run, RUN_FIELDS, {"prompt_id": INT})
    return summary["modes"]


RUN_FIELDS = {"run_id": INT, "condition_id": STR, "position": OPT_INT, "first_token_divergence": OPT_INT,
              "first_numeric_divergence": OPT_INT}  # what the choice reads of a summary.json run


def _summary(where: str) -> str:
    return str(Path(where) / SUMMARY)


def _require_conditions(divergent: list, by_id: dict, where: str) -> None:
    """Each divergent run's condition must be on record: bisect rebuilds its batch from it. A conditions.jsonl
    cut short (a torn last line, a copy cut off) loses some: refused by name, not a KeyError later."""
    for _, r in divergent:
        if r["condition_id"] not in by_id:
            raise RunDirError(f"{Path(where) / CONDITIONS}: no record of condition {r['condition_id']!r} (run "
                              f"{r['run_id']} diverged in it); the file was cut off or edited: run the probe again")


def _reference_run_id(mode: dict, prompt_id: int, where: str) -> int:
    """The reference run of the run's own prompt (a probe of several prompts has one per prompt)."""
    found = next((p.get("reference_run_id") for p in mode.get("prompts") or []
                  if isinstance(p, dict) and p.get("prompt_id") == prompt_id), mode.get("reference_run_id"))
    if not isinstance(found, int):
        raise RunDirError(f"{where}: no reference_run_id for prompt {prompt_id}; bisect compares with that run")
    return found


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
