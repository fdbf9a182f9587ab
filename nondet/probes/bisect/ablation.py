"""Causal ablation: rerun the lockstep with batch-invariant kernels for chosen op classes.

Each entry makes one set of op classes batch-invariant (nondet.kernels.batch_invariant)
for BOTH the reference and the divergent condition (the reference of a kernel mode is the
prompt alone under that mode), and asks: do the target's tokens still match the
reference's, and are the captured activations bit-identical at every step?

Plan: each class alone, then all classes. The minimal set is the smallest set whose
ablation makes every captured activation bit-identical (which implies equal tokens): a
single class when one works; otherwise it is grown from the origin's class by adding the
class of the first point that still differs, until nothing differs or the next culprit
cannot be ablated (then there is none).
"""

import time
from dataclasses import dataclass
from typing import Callable

from nondet.probes.bisect.lockstep import Lockstep

Replay = Callable[[tuple[str, ...]], Lockstep]  # op classes -> the lockstep under them


@dataclass
class Ablation:
    entries: list[dict]  # one per op-class set, in the order run (ablation.json "ablation")
    minimal_set: list[str] | None  # smallest set found that removes the divergence, or None


def run_ablation(replay: Replay, op_classes: tuple[str, ...], origin: dict | None,
                 on_entry: Callable[[tuple[str, ...]], None] | None = None) -> Ablation:
    done: dict[frozenset, dict] = {}

    def run(ops: tuple[str, ...]) -> dict:
        key = frozenset(ops)
        if key not in done:
            if on_entry:
                on_entry(ops)
            done[key] = entry(ops, replay, origin)
        return done[key]

    singles = [run((c,)) for c in op_classes]
    everything = run(tuple(op_classes))
    minimal = _minimal(singles, everything, origin, op_classes, run)
    return Ablation(list(done.values()), minimal)


def entry(ops: tuple[str, ...], replay: Replay, origin: dict | None) -> dict:
    started = time.perf_counter()
    ls = replay(ops)
    first = ls.first_diff
    return {
        "ops": list(ops),
        "tokens_match": ls.flip_step is None and ls.steps == len(ls.reference),
        "activations_match": first is None,
        "first_token_divergence": ls.flip_step,
        "first_numeric_step": ls.first_numeric_step,
        "first_diff": None if first is None else {k: first[k] for k in ("step", "module", "op_class", "layer")},
        "origin_removed": _removes(first, origin),
        "lasting": None if ls.lasting is None else {k: ls.lasting[k] for k in ("step", "module", "op_class", "layer")},
        "steps": ls.steps,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _removes(first: dict | None, origin: dict | None) -> bool:
    """True when, under the ablation, nothing differs at or before the origin point."""
    if origin is None or first is None:
        return True
    return (first["step"], first["order"]) > (origin["step"], origin["order"])


def _minimal(singles: list[dict], everything: dict, origin: dict | None, op_classes, run) -> list[str] | None:
    fixed = [e for e in singles if e["activations_match"]]
    if fixed:
        return fixed[0]["ops"]
    if not everything["activations_match"]:
        return None
    chosen = _start(singles, origin, op_classes)
    if not chosen:
        return list(op_classes)
    while len(chosen) < len(op_classes):
        culprit = run(tuple(chosen))
        if culprit["activations_match"]:
            return chosen
        nxt = (culprit["first_diff"] or {}).get("op_class")
        if nxt not in op_classes or nxt in chosen:
            return None
        chosen.append(nxt)
    return list(op_classes)


def _start(singles: list[dict], origin: dict | None, op_classes) -> list[str]:
    """The chain starts at the origin's class, or (not ablatable) at a class that removed it."""
    if origin and origin["op_class"] in op_classes:
        return [origin["op_class"]]
    return next((list(e["ops"]) for e in singles if e["origin_removed"]), [])
