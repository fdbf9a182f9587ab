"""The report's "Two deployments" section of `nondet probe --endpoint A --against B`: each side
against its own request sent alone, then B alone against A alone (summary.json's "against",
written by the against source). Two engines (a cross-engine comparison) are named as such.
Absent for other probes."""

from nondet.fmt import DASH, fmt_step
from nondet.reports.blocks import Para, Section, Table
from nondet.reports.tables import RunTables

HEADER = ["side", "endpoint", "engine", "runs", "prompt tokens", "distinct completions", "first token divergence",
          "first numeric divergence"]


def against_sections(t: RunTables) -> list[Section]:
    section = t.summary.get("against")
    if not section:
        return []
    na = section["across"]["logprobs_na"]
    rows = [[s["side"], s["endpoint"], s.get("engine") or DASH, fmt_step(s["n_runs"]),
             fmt_step(s.get("prompt_tokens")), fmt_step(s["distinct_completions"]),
             fmt_step(s["first_token_divergence"]), _bits(s["first_numeric_divergence"], na)] for s in section["sides"]]
    across = section["across"]
    rows.append(["A vs B", "alone vs alone", "", "", "", fmt_step(across["distinct_completions"]),
                 fmt_step(across["first_token_divergence"]), _bits(across["first_logprob_divergence"], na)])
    note = (f"Compared at level {section['compare_level']}. Each side's row: its runs against its own request sent "
            "alone (that deployment's batch variance under load). A vs B: B's request alone against A's, the run's "
            "reference; distinct completions over both sides.")
    title = "Two engines (a cross-engine comparison)" if section.get("cross_engine") else "Two deployments"
    return [Section(title, "against", [Table(HEADER, rows, [False] * 3 + [True] * 5), Para([note], kind="note"),
                                       *_cross_engine(section)])]


def _cross_engine(section: dict) -> list[Para]:
    if not section.get("cross_engine"):
        return []
    return [Para(["Cross-engine comparison: the two sides are different engines (named from what each server says "
                  "about itself). Their kernels, arithmetic and often their weight formats differ, so A and B are "
                  "expected to differ from step 0; that difference is not batch variance. Batch variance is each "
                  "side's own divergence under load, in its row."], kind="note")]


def _bits(step, na) -> str:
    return f"n/a ({na})" if na else fmt_step(step)
