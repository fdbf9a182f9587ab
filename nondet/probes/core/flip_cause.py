"""Why a run's tokens left its reference: the logits' bits, or the sampler's random stream.

When sampling, two things can change a row's token: its logits (a batch-variant kernel) and the
random number it is drawn with (a generator shared by the batch's rows: a row's draw depends on
how many rows drew before it). The step records tell them apart: at the first token that
differs, and at every step before it, the recorded distribution (the chosen token's logprob
bits before the flip, the top-5 ids and logprob bits and the top1-top2 margin at every step up
to it) is the reference's -> the same logits drew another token: "sampler". Anything differing
there -> "numerics". Without a recorded distribution (a server that returned no logprobs):
"unknown". Pure Python over the on-disk stream dicts.
"""

from nondet.probes.core.diff import first_token_divergence, references

CAUSES = ("numerics", "sampler", "unknown")


def flip_cause(ref: dict, run: dict) -> str | None:
    """None when the tokens agree; else one of CAUSES."""
    flip = first_token_divergence(ref, run)
    if flip is None:
        return None
    steps = list(zip(ref["steps"], run["steps"]))[: flip + 1]
    if len(steps) <= flip:  # one stream ended first: its last token's distribution is the other's end
        return "numerics"
    if any(a.get("top") is None or b.get("top") is None for a, b in steps):
        return "unknown"
    same_before = all(a["logprob"] == b["logprob"] for a, b in steps[:-1])
    same_distribution = all(a["top"] == b["top"] and a.get("margin") == b.get("margin") for a, b in steps)
    return "sampler" if same_before and same_distribution else "numerics"


def flip_causes(streams: list[dict]) -> dict | None:
    """One kernels mode's streams: {cause: runs} over the runs whose tokens left their prompt's
    reference; None when none did."""
    refs = references(streams)
    found = [flip_cause(refs[(s["kernels"], s.get("prompt_id", 0))], s) for s in streams if not s["is_reference"]]
    counts = {cause: found.count(cause) for cause in CAUSES if found.count(cause)}
    return counts or None
