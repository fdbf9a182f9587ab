"""`nondet gate` from Python: probe, judge under a policy, write JUnit, pick an exit code.

    python examples/gate_api.py                         # the embedded demo model
    python examples/gate_api.py --model ./my-model      # a local Hugging Face causal LM (as nondet's --model)

Probes the model with its own kernels and with nondet's batch-invariant kernels, judges
both under the `identical` policy, writes nondet-api-junit.xml and exits 0 only when the
batch-invariant run meets the policy. On the demo model the default kernels fail (a token
flips near step 93 at batch size 8) and the batch-invariant ones pass.
"""

import argparse
import dataclasses
import sys

from nondet.gate import GateOutputs, Policy, Verdict, run_gate
from nondet.gate.junit import write_junit
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig


def gate(model: str | None, kernels: str, policy: Policy) -> Verdict:
    """The gate library on one probe config: probe, judge, gate.json (no bisect); named by its kernels."""
    config = ProbeConfig(model=ModelSpec(model), batch_sizes=(1, 8), max_new_tokens=100,
                         kernels=(kernels,), out=f"nondet-runs/gate-api-{kernels}")
    result = run_gate([config], policy, GateOutputs(bisect=False))
    return dataclasses.replace(result.verdicts[0], name=f"{kernels} kernels")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="nondet gate from Python, on both kernel modes.")
    parser.add_argument("--model", "-m", help="local directory or hub id (default: the embedded demo model)")
    model = parser.parse_args(argv[1:]).model
    policy = Policy("identical")  # or Policy("max-distinct", 2), Policy.parse("min-divergence-step = 50")
    verdicts = [gate(model, kernels, policy) for kernels in ("default", "batch-invariant")]
    for verdict in verdicts:
        print(f"{verdict.name}: {verdict.message}")
    write_junit("nondet-api-junit.xml", verdicts)
    return 0 if verdicts[-1].passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
