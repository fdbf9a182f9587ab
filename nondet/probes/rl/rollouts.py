"""The sampler side of `nondet rl --rollouts FILE`: exported rollouts written as sampler streams.

Nothing is sampled: each rollout (nondet/rl/rollouts.py validated it) becomes one sampler
StreamRecord of kernels "external" (its logprobs as float.hex, exactly as given), so the run
directory holds both sides and one summary pairs them as for an in-process sampler.
"""

from nondet.probes.core.source import Emit, Opened, Planned
from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord, Summary

EXTERNAL = "external"  # the kernels field of rollouts: an RL framework's sampler, not ours
CONDITION_ID = "external/rollouts"


class RolloutsSource:
    kind = "rl-rollouts"

    def __init__(self, rollouts, loaded, run_ids) -> None:
        self.rollouts = rollouts  # [Rollout]
        self.loaded = loaded
        self.run_ids = run_ids

    def open(self) -> Opened:
        from nondet.probes.core.numerics import fingerprint

        return Opened(fingerprint(self.loaded.description, EXTERNAL))

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        return [Planned(CONDITION_ID, "rollouts (exported sampler)", EXTERNAL, None)]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        for i, r in enumerate(self.rollouts):
            emit(StreamRecord(
                run_id=next(self.run_ids), condition_id=CONDITION_ID, kernels=EXTERNAL, position=None,
                is_reference=True, prompt_id=i, prompt_tokens=len(r.prompt_ids), finish="length",
                steps=[StepRecord(token=t, logprob=float(lp).hex()) for t, lp in zip(r.completion_ids, r.logprobs)],
                extra={"side": "sampler", "prompt_ids": list(r.prompt_ids)}))
        return ConditionRecord(condition_id=CONDITION_ID, kernels=EXTERNAL, batch_size=None, positions=None,
                               fillers="none", label="rollouts", load=self.kind, extra={"side": "sampler"})

    def summarize(self, streams: list[dict]) -> Summary:
        return Summary(modes={})  # nondet rl's summary pairs both sides: nondet.rl.summary

    def close(self) -> None:
        pass
