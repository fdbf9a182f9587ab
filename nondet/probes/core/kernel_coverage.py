"""What a run's batch-invariant kernels covered, as its run directory records and its verdict says.

Before a run uses the mode on an in-process model, the model's op census (kernels/census.py) is
taken: an op the mode does not cover refuses the run (exit 3, one line naming module and op), unless
the user allowed it (`--allow-uncovered`); then fingerprint.json "census" lists what was not
covered, summary.json "kernel_coverage" says "partly invariant", the verdict sentence says so, and
the gate cannot pass a run that promised batch-invariant kernels.
"""

from dataclasses import replace

from nondet.errors import UnsupportedModelError
from nondet.rundir.records import Summary
from nondet.verdict import injected_control_line, partly_line

INVARIANT, PARTLY = "invariant", "partly invariant"


def census_entry(model, compiled: bool, allow_uncovered: bool, saved=None) -> dict:
    """fingerprint.json's "census": the census's counts, the uncovered ops, the logit check, where it was
    taken, and "coverage". Raises UnsupportedModelError (exit 3) where the mode refuses the model. saved: the
    census's store between processes (saved_census.py), or None."""
    from nondet.kernels.coverage import UnsupportedModel
    from nondet.kernels.mode import verify_coverage

    try:
        found = verify_coverage(model, compiled=compiled, allow_uncovered=allow_uncovered, saved=saved)
    except UnsupportedModel as exc:
        raise UnsupportedModelError(str(exc)) from None
    return {**found.to_json(), "coverage": PARTLY if found.uncovered() else INVARIANT}


def label_summary(summary: Summary, fingerprint: dict | None) -> Summary:
    """The summary with "kernel_coverage" (the census's, merged with what the source found itself, as
    the continuous engine's attention) and, for a partly invariant run, the verdict saying so."""
    census = (fingerprint or {}).get("census") or {}
    found = summary.extra.get("kernel_coverage") or {}
    if not census and not found:
        return summary
    uncovered = list(census.get("uncovered", [])) + list(found.get("uncovered", []))
    section = {"coverage": PARTLY if uncovered else INVARIANT, "uncovered": uncovered}
    injected = ((fingerprint or {}).get("model") or {}).get("injected_variance")
    if injected:
        section["injected_control"] = injected_control_line(injected)
    verdict = f"{summary.verdict} [{partly_line(uncovered)}]" if uncovered else summary.verdict
    return replace(summary, verdict=verdict, extra={**summary.extra, "kernel_coverage": section})
