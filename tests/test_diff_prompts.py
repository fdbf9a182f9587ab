"""Several prompts merged into one mode summary: a batch holding two prompts is one condition."""

from nondet.probes.core.diff_prompts import merge_prompts


def _summary(ref_run: int, conditions: list[str]) -> dict:
    rows = [{"condition_id": c, "n_runs": 1, "distinct_completions": 1, "first_token_divergence": None,
             "first_numeric_divergence": None} for c in conditions]
    return {"kernels": "default", "reference_run_id": ref_run, "n_runs": len(rows), "n_conditions": len(rows),
            "distinct_completions": 1, "most_common_count": len(rows), "first_token_divergence": None,
            "first_numeric_divergence": None, "runs": [], "completions": [], "conditions": rows,
            "branch_tree": None}


def test_a_batch_of_two_prompts_counts_as_one_condition():
    p0 = _summary(0, ["default/p0/bs1/ref", "default/bs4/rows/0"])
    p1 = _summary(1, ["default/p1/bs1/ref", "default/bs4/rows/0"])  # the same batch, the other target row
    merged = merge_prompts([p0, p1], [0, 1], ("a", "b"))
    assert [c["condition_id"] for c in merged["conditions"]] == [
        "default/p0/bs1/ref", "default/bs4/rows/0", "default/p1/bs1/ref"]
    assert merged["n_conditions"] == 3 and merged["n_runs"] == 4
