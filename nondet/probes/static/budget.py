"""`nondet probe --budget SECONDS`: plan the static sweep to fit a time budget.

The cost of a generate call is its decode steps times the seconds per step at its batch
size. Seconds per step are measured before the sweep with two short calls of the first
prompt (batch size 1 and the largest batch size; a straight line between them), so the
plan uses this host's speed, threads and kernels. The sweep is then kept in
levels, most informative first, each level whole or not at all:

    1. every prompt's reference (batch size 1): without it nothing can be compared (kept even
       over the budget: a probe of one prompt alone is the least it can run)
    2. the largest batch size (the batch most unlike a lone request)
    3. the smallest batch size above 1
    4. the other batch sizes, largest first

A level that does not fit is left out and the next, cheaper one is tried. If not even the
references and one batch size fit, prompts are dropped from the end until they do (one
prompt at least). What was left out is said in summary.json ("budget") and on the terminal.
Every kernels mode of a level is kept or left out together, so --confirm stays paired.
"""

from dataclasses import dataclass

from nondet.probes.core.conditions import Condition

TIMING_TOKENS = 8  # decode steps of the longer timing call: long enough to dwarf the prefill on CPU
PLAN_SHARE = 0.75  # of the time left after the timing calls. The timing calls are short, so they miss
#                    the attention cost of a growing KV cache; the rest also pays for writing records,
#                    the diff and the summary. On the 2-core CPU: 7 s budgets ran 7.7 s at 1.0, 7.6 s at 0.85.


@dataclass(frozen=True)
class StepCost:
    """Seconds per decode step at two batch sizes; a straight line in between (and beyond)."""

    small: tuple[int, float]  # (batch size 1, seconds per step)
    large: tuple[int, float]  # (largest batch size, seconds per step)
    call: float = 0.0  # seconds of a call besides its decode steps (prefill, setup, records), at the largest size

    def at(self, batch_size: int) -> float:
        (b0, t0), (b1, t1) = self.small, self.large
        return t0 if b1 == b0 else t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0)


def from_timings(short: dict[int, float], long: dict[int, float], steps: int) -> StepCost:
    """StepCost from calls of 1 and `steps` decode steps at each batch size ({size: seconds})."""
    per_step = {b: max(long[b] - short[b], 0.0) / (steps - 1) for b in short}
    (b0, b1) = (min(short), max(short))
    return StepCost((b0, per_step[b0]), (b1, per_step[b1]), max(short[b1] - per_step[b1], 0.0))


@dataclass(frozen=True)
class Fitted:
    conditions: list[Condition]  # the plan kept, in run order
    seconds: float  # its estimated time
    left_out: list[str]  # one line per level left out ("batch size 4: 4 generate calls, about 31 s")


def fit(conditions: list[Condition], costs: dict[str, StepCost], tokens: int, seconds: float) -> Fitted:
    """The levels of `conditions` that fit in `seconds`; costs: per kernels mode."""
    kept: list[int] = []  # batch sizes kept
    left_out: list[str] = []
    spent = 0.0
    for b in levels(sorted({c.batch_size for c in conditions})):
        level = [c for c in conditions if c.batch_size == b]
        cost = sum(estimate(c, costs, tokens) for c in level)
        if b == 1 or spent + cost <= seconds:  # the references always run: nothing compares without them
            kept.append(b)
            spent += cost
        else:
            left_out.append(f"batch size {b}: {len(level)} generate calls, about {cost:.0f} s")
    return Fitted([c for c in conditions if c.batch_size in kept], spent, left_out)


def levels(sizes: list[int]) -> list[int]:
    """Batch sizes in the order they are kept: 1, the largest, the smallest above 1, the rest largest first."""
    above = [b for b in sizes if b > 1]
    first = [1] + ([max(above)] if above else []) + ([min(above)] if len(above) > 1 else [])
    return first + sorted((b for b in above if b not in first), reverse=True)


def estimate(condition: Condition, costs: dict[str, StepCost], tokens: int) -> float:
    """Seconds for one generate call: every decode step at its batch size (EOS may end it sooner)."""
    cost = costs[condition.kernels]
    return cost.call + tokens * cost.at(condition.batch_size)


def describe(budget: float, fitted: Fitted, costs: dict[str, StepCost], dropped_prompts: list[int]) -> dict:
    """summary.json's "budget" section."""
    left_out = list(fitted.left_out)
    if dropped_prompts:
        left_out.insert(0, f"prompts {', '.join(f'p{k}' for k in dropped_prompts)}: not run")
    return {"seconds": budget, "planned_seconds": round(fitted.seconds, 1),
            "ms_per_call": {mode: round(1000 * c.call, 2) for mode, c in costs.items()},
            "ms_per_step": {mode: {str(b): round(1000 * t, 2) for b, t in (c.small, c.large)}
                            for mode, c in costs.items()},
            "left_out": left_out}
