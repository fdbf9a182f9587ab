"""The report's "Tensor parallelism" section: batch variance at each TP degree, and each degree
against the reference degree (summary.json's "tensor_parallel", written by the tensor-parallel
source). Absent for other probes."""

from nondet.fmt import fmt_step
from nondet.reports.blocks import Para, Section, Table
from nondet.reports.tables import RunTables

BY_DEGREE = ["kernels", "TP degree", "runs", "distinct completions", "first token divergence",
             "first numeric divergence"]
VS_REFERENCE = ["kernels", "TP degree", "against", "bitwise equal", "first token divergence",
                "first numeric divergence"]


def tensor_parallel_sections(t: RunTables) -> list[Section]:
    section = t.summary.get("tensor_parallel")
    if not section:
        return []
    modes = section.get("modes", {})
    by_degree = [[mode, f"TP{r['tp']}", fmt_step(r["n_runs"]), fmt_step(r["distinct_completions"]),
                  fmt_step(r["first_token_divergence"]), fmt_step(r["first_numeric_divergence"])]
                 for mode, m in modes.items() for r in m.get("by_degree", [])]
    versus = [[mode, f"TP{r['tp']}", f"TP{r['against']}", "yes" if r["bitwise_equal"] else "no",
               fmt_step(r["first_token_divergence"]), fmt_step(r["first_numeric_divergence"])]
              for mode, m in modes.items() for r in m.get("vs_reference", [])]
    blocks = [Table(BY_DEGREE, by_degree, [False, False, True, True, True, True]),
              Para(["Batch variance at each degree: every run of a degree against the prompt alone at batch size 1 "
                    "at that degree."], kind="note")]
    if versus:
        blocks += [Table(VS_REFERENCE, versus, [False, False, False, False, True, True]),
                   Para([f"TP degree against TP{section.get('reference_degree')}: the prompt alone at batch size 1 "
                         "at each degree. The row-parallel layers' all-reduce and the split K of their matmuls "
                         "change the summation order, so the logprob bits may differ from step 0 while the tokens "
                         "hold."], kind="note")]
    return [Section("Tensor parallelism", "tensor-parallel", blocks)]
