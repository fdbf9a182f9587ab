"""A check that could not have failed fails the gate (gate/vacuous.py), each beside its control: the same
summary where a difference could have shown passes."""

import json
import os

import cli_runner
from nondet.gate import Policy, evaluate


def _mode(conditions: list[str], runs_per_condition: int = 1) -> dict:
    """A one-prompt kernels mode whose runs all agree with the reference (summary.json's shape)."""
    runs = [{"run_id": 0, "condition_id": "default/x/ref", "is_reference": True, "completion_id": 0,
             "position": 0, "first_token_divergence": None, "first_numeric_divergence": None}]
    for cid in conditions:
        for _ in range(runs_per_condition):
            runs.append({"run_id": len(runs), "condition_id": cid, "is_reference": False, "completion_id": 0,
                         "position": 0, "first_token_divergence": None, "first_numeric_divergence": None})
    return {"kernels": "default", "reference_run_id": 0, "distinct_completions": 1, "n_runs": len(runs),
            "completions": [{"completion_id": 0, "tokens": [1, 2]}], "branch_tree": None, "runs": runs,
            "conditions": [{"condition_id": c, "n_runs": sum(r["condition_id"] == c for r in runs),
                            "first_token_divergence": None, "first_numeric_divergence": None}
                           for c in ["default/x/ref", *conditions]]}


def test_nothing_compared_is_not_a_pass():
    empty = evaluate({"modes": {"default": _mode([])}})
    assert not empty.passed and empty.message.startswith("nothing compared (identical): no condition besides "
                                                         "the reference ran")
    assert evaluate({"modes": {"default": _mode(["default/bs2/ends"])}}).passed  # the control


def test_a_continuous_run_whose_target_was_alone_fails():
    cids = ["default/cb/run1", "default/cb/run2"]
    alone = evaluate({"modes": {"default": _mode(cids)}, "load": {"mode": "continuous", "alone": cids[:1]}})
    assert [c.condition_id for c in alone.failures] == ["default/cb/run1"]
    assert alone.failures[0].message.startswith("the target was alone in the engine at every step")
    assert evaluate({"modes": {"default": _mode(cids)}, "load": {"mode": "continuous", "alone": []}}).passed


def test_a_speculative_form_that_drafted_nothing_fails():
    cid = "default/spec/ngram4"
    row = {"condition_id": cid, "kernels": "default", "speculative": "ngram:4", "rounds": 4}
    summary = {"modes": {"default": _mode([cid])}, "speculative": {"conditions": [{**row, "drafted": 0}]}}
    verdict = evaluate(summary, policy=Policy(axis="speculative"))
    assert not verdict.passed and "ngram:4 drafted no token in 4 round(s)" in verdict.failures[0].message
    summary["speculative"]["conditions"] = [{**row, "drafted": 7}]
    assert evaluate(summary, policy=Policy(axis="speculative")).passed  # the control: it drafted


def test_max_distinct_over_too_few_runs_fails_and_over_enough_passes():
    few = evaluate({"modes": {"default": _mode(["default/bs2/ends"])}}, policy=Policy("max-distinct", 2))
    assert [c.condition_id for c in few.failures] == ["max-distinct"]
    enough = evaluate({"modes": {"default": _mode(["default/bs4/ends"], 3)}}, policy=Policy("max-distinct", 2))
    assert enough.passed


def test_the_gate_with_only_the_reference_exits_1_and_the_probe_says_alone_runs(tmp_path):
    env = dict(os.environ)
    r = cli_runner.run(("gate", "-b", "1,2,4", "-n", "2", "--runs", "1", "--inject-variance", "--no-bisect",
                        "-p", "hello", "--out", str(tmp_path / "g")), env=env, timeout=300)
    assert r.returncode == 1 and "nothing compared (identical)" in r.stdout, r.stdout + r.stderr
    r = cli_runner.run(("probe", "--load", "continuous", "--filler-requests", "0", "--runs", "2", "-n", "3",
                        "-p", "hello", "--out", str(tmp_path / "cb")), env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    load = json.loads((tmp_path / "cb" / "summary.json").read_text())["load"]
    assert load["alone"] == ["default/cb/run1", "default/cb/run2"]
    assert "2 of 2 run(s) had the target alone in the engine" in " ".join(r.stdout.split())
    r = cli_runner.run(("probe", "--load", "continuous", "--runs", "2", "-n", "3", "-p", "hello", "--out",
                        str(tmp_path / "cb-fillers")), env=env, timeout=300)  # the control: fillers arrive
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "cb-fillers" / "summary.json").read_text())["load"]["alone"] == []


def test_the_probes_verdict_says_nothing_was_compared_where_only_the_reference_ran():
    from nondet.verdict import verdict

    alone = {"n_runs": 1, "distinct_completions": 1, "first_token_divergence": None,
             "first_numeric_divergence": None}
    assert verdict({"default": alone}) == ("default kernels: nothing compared, only the reference ran (the prompt "
                                           "alone at batch size 1)")
    two = {**alone, "n_runs": 2}  # the control: a second run agreeing with the reference
    assert verdict({"default": two}).startswith("default kernels: batch-invariant, 1 distinct completion over 2")


def test_a_reference_that_ended_at_once_is_said_beside_the_verdict():
    mode = _mode(["default/bs2/ends"])
    mode["completions"] = [{"completion_id": 0, "tokens": [7]}]
    verdict = evaluate({"modes": {"default": mode}})
    assert verdict.passed and "only the prefill's next token was compared" in verdict.message
    assert "prefill" not in evaluate({"modes": {"default": _mode(["default/bs2/ends"])}}).message  # two tokens
