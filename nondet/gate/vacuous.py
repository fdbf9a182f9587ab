"""What a gate policy could not have failed on: such a check is a failure of the gate, not a pass.

A pass is evidence only where a difference could have shown. Three ways it cannot:
- a condition whose runs repeat the reference's computation: a continuous-load run whose target never
  shared an engine step with another request, a speculative form that drafted no token (every token
  from one-token decoding, as the reference's);
- a threshold the runs cannot exceed: `max-distinct = N` with at most N runs per prompt, the reference
  included (thresholds that no run can exceed whatever it holds are refused when parsed: policy.py);
- nothing compared at all (no condition besides the reference): Verdict says so itself.
A weak check is said, not failed: a reference that ended after one token compared the prefill alone.
Pure Python over summary.json (no torch).
"""

from dataclasses import replace

from nondet.gate.prompts import per_prompt

MAX_DISTINCT = "max-distinct"


def unexercised(summary: dict, axis: str) -> dict[str, str]:
    """{condition_id: why its runs could not differ from the reference} for the axis judged."""
    why: dict[str, str] = {}
    if axis == "batch":
        for cid in (summary.get("load") or {}).get("alone") or []:
            why[cid] = ("the target was alone in the engine at every step (no other request shared one): it "
                        "repeats the reference's computation; raise --rate or --filler-requests")
    if axis == "speculative":
        for row in (summary.get("speculative") or {}).get("conditions") or []:
            if not row.get("drafted"):
                why[row["condition_id"]] = (
                    f"{row['speculative']} drafted no token in {row.get('rounds', 0)} round(s): every token came "
                    "from one-token decoding, as the reference's; raise --max-new-tokens or use a form that "
                    "drafts (self:K)")
    return why


def fail_unexercised(results: list, why: dict[str, str]) -> list:
    """ConditionResults with the passes of unexercised conditions turned into failures saying why."""
    return [replace(r, passed=False, message=why[r.condition_id]) if r.passed and r.condition_id in why else r
            for r in results]


def unfailable_threshold(summary: dict, require: str, value: float | None) -> list[tuple[str, int, str]]:
    """(kernels mode, runs per prompt, message) for each mode a `max-distinct = N` cannot fail on."""
    if require != MAX_DISTINCT or value is None:
        return []
    found = []
    for name, mode in summary["modes"].items():
        most = max(len(view["runs"]) for view in per_prompt(mode))
        if most <= int(value):
            found.append((name, most, f"max-distinct = {int(value)} cannot fail here: {name} kernels ran at most "
                                      f"{most} run(s) per prompt (the reference included), so at most {most} "
                                      "distinct completions; give a smaller N, or more runs (--runs, --batch-sizes)"))
    return found


def short_reference(summary: dict) -> str:
    """A note where a reference completion ended after one token (EOS at once): then only the prefill's next
    token was compared, and a divergence that starts in decoding could not show."""
    for mode in summary["modes"].values():
        for view in per_prompt(mode) if "completions" in mode else ():  # a flip-rate summary may hold none
            ref = next((c for c in view["completions"] if c["completion_id"] == 0), None)
            if ref is not None and len(ref["tokens"]) <= 1:
                return (f"a reference completion ended after {len(ref['tokens'])} token(s): only the prefill's next "
                        "token was compared, no decode step")
    return ""
