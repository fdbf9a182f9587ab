"""The CI gate: a policy and its verdict, config loading, the gate run, JUnit and GitHub outputs.

Sits above probes (it runs them) and beside reports (which reads gate.json as a dict, never
this package). Importing it loads no torch: probes are imported when a gate runs.

    from nondet.gate import Policy, evaluate
    verdict = evaluate(summary, streams, Policy("max-distinct", 2))
    verdict.passed, verdict.failures[0].message

    from nondet.gate import GateOutputs, run_gate
    result = run_gate([probe_config], Policy.parse("identical"), GateOutputs(junit="junit.xml"))
"""

from nondet.gate.policy import ConditionResult, Policy, Verdict, evaluate
from nondet.gate.run import Gated, GateHooks, GateOutputs, GateResult, GateTarget, prompt_dirs, run_gate, run_targets

__all__ = ["ConditionResult", "Gated", "GateHooks", "GateOutputs", "GateResult", "GateTarget", "Policy", "Verdict",
           "evaluate", "prompt_dirs", "run_gate", "run_targets"]
