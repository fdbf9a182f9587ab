"""How sure a verdict is: the divergence rate with a 95% interval, and a grade per prompt.

A count alone overstates a pass: 0 flips in 5 runs cannot rule out a flip rate of 40%. So each
kernels mode's summary carries, per prompt and over all prompts:

- the runs that diverged in tokens from their prompt's reference, of the runs that are not the
  reference (nor stopped by --fail-fast before their tokens left it: undecided, counted apart), with
  the Wilson score interval at 95% (nondet/interval.py). With 0 flips the upper bound is the statement: "0 of 30 runs diverged: the flip rate is below 11% at 95%".
- a grade: unstable (some run diverged in tokens); fragile (none did, but at some step the
  reference's top-1 / top-2 logprob margin is below the largest logprob difference these runs
  measured between a run and its reference at the same step and token, or 0, an exact tie: one more
  such difference could flip the token, flip seen or not); stable otherwise. A mode whose runs are bit-identical
  measured no difference, so only a flip makes it unstable.

Pure Python over the on-disk stream dicts (floats as float.hex strings); no torch.
"""

from nondet.interval import wilson
from nondet.probes.core.diff import first_token_divergence, is_stopped
from nondet.rundir.files import hex_to_float

STABLE, FRAGILE, UNSTABLE = "stable", "fragile", "unstable"
_ORDER = (STABLE, FRAGILE, UNSTABLE)


def rate_entry(diverged: int, runs: int) -> dict:
    low, high = wilson(diverged, runs)
    return {"diverged": diverged, "runs": runs, "rate": diverged / runs if runs else None, "low": low, "high": high}


def prompt_confidence(streams: list[dict]) -> dict:
    """One prompt's streams of one kernels mode (its reference among them): rate, interval, grade."""
    ref = next(s for s in streams if s["is_reference"])
    # a run --fail-fast stopped before its tokens left the reference's is undecided: not counted either way
    undecided = [s for s in streams if is_stopped(s) and first_token_divergence(ref, s) is None]
    others = [s for s in streams if not s["is_reference"] and not any(s is u for u in undecided)]
    diverged = sum(first_token_divergence(ref, s) is not None for s in others)
    noise = max((_largest_difference(ref, s) for s in streams if not s["is_reference"]), default=0.0)
    fragile_steps = [i for i, step in enumerate(ref["steps"]) if _near_tie(step.get("margin"), noise)]
    grade = UNSTABLE if diverged else FRAGILE if fragile_steps else STABLE
    return {**rate_entry(diverged, len(others)), "grade": grade, "noise": noise, "fragile_steps": fragile_steps,
            **({"undecided": len(undecided)} if undecided else {})}


def mode_confidence(streams: list[dict]) -> dict:
    """One kernels mode's streams, any number of prompts: each prompt's entry and the pooled rate;
    the mode's grade is its worst prompt's."""
    prompt_ids = list(dict.fromkeys(s.get("prompt_id", 0) for s in streams))
    prompts = {k: prompt_confidence([s for s in streams if s.get("prompt_id", 0) == k]) for k in prompt_ids}
    pooled = rate_entry(sum(p["diverged"] for p in prompts.values()), sum(p["runs"] for p in prompts.values()))
    undecided = sum(p.get("undecided", 0) for p in prompts.values())
    grades = [p["grade"] for p in prompts.values()]
    return {**pooled, **({"undecided": undecided} if undecided else {}), "grade": max(grades, key=_ORDER.index),
            "grades": {g: grades.count(g) for g in _ORDER if g in grades},
            "prompts": {str(k): p for k, p in prompts.items()}}


def _near_tie(margin: str | None, noise: float) -> bool:
    """A reference step one difference away from another token: its top-1 / top-2 margin below the
    measured noise, or an exact tie (margin 0: any difference at all picks the other token)."""
    return margin is not None and (hex_to_float(margin) == 0.0 or hex_to_float(margin) < noise)


def _largest_difference(ref: dict, run: dict) -> float:
    """The largest |logprob difference| between a run and its reference at the same step and token,
    over the steps before their tokens part (past a flip the histories differ)."""
    largest = 0.0
    for a, b in zip(ref["steps"], run["steps"]):
        if a["token"] != b["token"]:
            break
        theirs = {tok: lp for tok, lp in (b.get("top") or [])}
        if a.get("logprob") is not None and b.get("logprob") is not None:
            largest = max(largest, abs(hex_to_float(a["logprob"]) - hex_to_float(b["logprob"])))
        for tok, lp in a.get("top") or []:
            if tok in theirs:
                largest = max(largest, abs(hex_to_float(lp) - hex_to_float(theirs[tok])))
    return largest
