"""--fail-fast: a batched call stops once every compared row's result against its reference is settled.

Why: a gate that fails spends most of its time decoding past the step that decided it. The gate's
CPU benchmark (8 prompts x 300 tokens x batch sizes 1, 2, 4, 8, default kernels) settles every
condition's verdict within its first ~50 steps, where the rows would decode 300.

A rule is the gate's requirement on the batch axis, and a row is settled when its verdict can no
longer change with more steps:

    identical               fails at the first step whose token or logprob differs from the reference's
    max-logprob-diff = X    fails at the first token that differs or logprob more than X away
    min-divergence-step = S fails at a token that differs before step S; passes once S steps agree

A row is also settled once it has as many steps as its reference (the reference ended: one step more
is a divergence, the same end is the whole comparison). The call stops when all its compared rows are
settled, never row by row: a stopped row would feed pad tokens, and what other rows hold can move a
row's bits (an MoE's expert batches), so each row keeps the batch it had until the call ends.

The check only says "failed" where the policy, reading the recorded prefix, fails too: token and
logprob compared as the recorder keeps them (fp32 values; a logprob difference in float64, as the
policy computes it), and equal values with other bits (+0 / -0) count as agreeing, so the call goes on
and the policy sees the rest. A stopped stream's finish is STOPPED: the diff treats its end as not yet
seen (core/diff.py), never as a divergence.

Per step, on the logits' device: a few [rows] comparisons against the references as tensors; no host
sync beyond the one generate's stop check already makes.
"""

from dataclasses import dataclass

from nondet.errors import UsageError

STOPPED = "stopped"  # StreamRecord.finish of a stream whose call stopped at its settled verdicts
RULES = ("identical", "max-logprob-diff", "min-divergence-step")


@dataclass(frozen=True)
class StopRule:
    require: str  # one of RULES
    value: float | None = None  # X of max-logprob-diff, S of min-divergence-step

    @classmethod
    def parse(cls, text: str) -> "StopRule":
        """'identical', 'max-logprob-diff = 0.001', 'min-divergence-step = 50' (ProbeConfig.fail_fast)."""
        name, sep, value = (part.strip() for part in text.partition("="))
        if name not in RULES:
            raise UsageError(f"--fail-fast stops at a settled verdict under {', '.join(RULES)}, not {name!r}: "
                             "max-distinct and max-flip-rate compare whole completions")
        if (name == "identical") == bool(sep):
            raise UsageError(f"fail-fast rule {text!r}: identical takes no value, the others one")
        try:
            return cls(name, float(value) if sep else None)
        except ValueError:
            raise UsageError(f"fail-fast rule {text!r}: {value!r} is not a number") from None


def settled_criterion(rule: StopRule, references: dict[int, list[dict]], recorder):
    """A transformers StoppingCriteria for one call: True for every row once every row of `references`
    ({target row: its reference's step dicts}) is settled under `rule`. `fired` says whether it stopped
    the call."""
    import torch
    from transformers import StoppingCriteria

    rows = list(recorder.target_rows)
    if sorted(references) != sorted(rows):
        raise ValueError("a settled stop needs a reference for every target row")
    length = max(len(references[r]) for r in rows)

    def column(field, default, dtype):
        return torch.tensor([[_value(s, field) for s in references[r]] + [default] * (length - len(references[r]))
                             for r in rows], dtype=dtype)

    ref_tokens = column("token", -1, torch.long)  # [R, T]
    ref_logprobs = column("logprob", float("nan"), torch.float64)  # exact: fp32 values kept as float.hex
    ends = torch.tensor([len(references[r]) for r in rows])  # [R] steps in each reference

    class Settled(StoppingCriteria):
        def __init__(self) -> None:
            self.settled = None  # [R] bool on the logits' device
            self.fired = False
            self.device_refs = None

        def __call__(self, input_ids, scores, **kwargs):
            tokens, logprobs, step = recorder.latest()
            if self.device_refs is None:
                self.device_refs = (ref_tokens.to(tokens.device), ref_logprobs.to(tokens.device), ends.to(tokens.device))
                self.settled = torch.zeros(len(rows), dtype=torch.bool, device=tokens.device)
            toks, lps, end = self.device_refs
            at = min(step, length - 1)
            differs = tokens != toks[:, at]
            if rule.require == "identical":
                differs |= logprobs.to(torch.float64) != lps[:, at]
            elif rule.require == "max-logprob-diff":
                differs |= (logprobs.to(torch.float64) - lps[:, at]).abs() > rule.value
            elif step >= rule.value:  # min-divergence-step: steps from S on may differ
                differs = torch.zeros_like(differs)
            passed = torch.full_like(differs, step + 1 >= rule.value) if rule.require == "min-divergence-step" \
                else torch.zeros_like(differs)
            self.settled |= differs | passed | (step + 1 >= end)
            done = self.settled.all()
            self.fired = self.fired or bool(done)  # CPU: free; on CUDA generate syncs on its stop check anyway
            return done.expand(input_ids.shape[0])

    return Settled()


def _value(step: dict, field: str):
    return float.fromhex(step[field]) if field == "logprob" else step[field]


def mark_stopped(rows: dict[int, list[dict]], max_new_tokens: int, eos: list[int]) -> dict[int, list[dict]]:
    """A call the criterion stopped: each row that did not reach its own end (an EOS, or max_new_tokens)
    gets "stopped" on its last step, which the source turns into the stream's finish (static/source.py)."""
    for steps in rows.values():
        if steps and len(steps) < max_new_tokens and steps[-1]["token"] not in eos:
            steps[-1]["stopped"] = True
    return rows


def stopped(steps: list[dict]) -> bool:
    """Whether a row's steps were cut by a settled stop; takes the mark off (it is not a step's field)."""
    return bool(steps) and bool(steps[-1].pop("stopped", False))
