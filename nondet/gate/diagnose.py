"""The gate's diagnosis of a violation: bisect the first failing condition up to where its bits are born.

A diagnostic never changes the verdict: the gate reports its one-line result next to it.
"""

from pathlib import Path

from nondet.gate.policy import FLIP_RATE, KERNEL_COVERAGE, Verdict


def bisect_first_failure(run_dir: Path, verdict: Verdict) -> str | None:
    """`nondet bisect` on the first failing condition; its one-line result, or None when bisect
    is not installed or no condition failed (a failed flip rate or kernel coverage judges a whole mode)."""
    try:
        from nondet.probes.bisect import BisectConfig
        from nondet.probes.bisect_probe import run_bisect
    except ImportError:
        return None
    conditions = [c for c in verdict.failures if c.condition_id not in (FLIP_RATE, KERNEL_COVERAGE)]
    if not conditions:
        return None
    first = conditions[0]
    # Up to the step where the bits first differ: where the difference is born and which op
    # class causes it, in seconds; `nondet bisect RUN_DIR` replays on through the token flip.
    born = first.first_numeric_divergence if first.first_numeric_divergence is not None else first.first_token_divergence
    config = BisectConfig(run_dir=str(run_dir), condition=first.condition_id,
                          max_steps=None if born is None else born + 1)
    result = run_bisect(config)
    return bisect_line(result.bisect, first.first_numeric_divergence)


def bisect_line(bisect: dict, logprob_step: int | None = None) -> str:
    """Where the bits are born (any activation), and how that relates to the table's number (the logprob)."""
    origin, lasting = bisect.get("origin"), bisect.get("lasting")
    if not origin:
        return "no captured module differs"
    where = f"first differing activation bits at {_point(origin)}"
    if "lasting" in bisect and (lasting is None or _point(lasting) != _point(origin)):
        where += f", transient; lasting divergence from {_point(lasting)}" if lasting else ", transient"
    if logprob_step is not None and logprob_step != origin["step"]:
        why = ("where the lasting divergence begins" if lasting and lasting["step"] == logprob_step else
               "which no earlier activation difference had reached")
        where += (f"; the sampled token's logprob bits first differ at step {logprob_step} (the table's first "
                  f"numeric divergence), {why}")
    minimal = bisect.get("minimal_set")
    return where + (f"; batch-invariant {' + '.join(minimal)} removes it" if minimal else "")


def _point(p: dict) -> str:
    return f"step {p['step']} in {p['module']} ({p['op_class']})"
