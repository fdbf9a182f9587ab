"""CI outputs of `nondet gate`: the policy and its verdict, config loading, JUnit, GitHub Actions.

Pure Python on run-directory records (summary.json, streams.jsonl); imports no torch.

    from nondet.reports.ci import Policy, evaluate
    verdict = evaluate(summary, streams, Policy(max_distinct=2))
    verdict.passed, verdict.failures[0].message
"""

from nondet.reports.ci.policy import ConditionResult, Policy, Verdict, evaluate

__all__ = ["ConditionResult", "Policy", "Verdict", "evaluate"]
