"""--fail-fast in the static source: the references decoded so far, and what each call is held to.

A batched call can stop at its rows' settled verdicts (core/settled.py) only with every target row's
reference at hand: the prompt alone at batch size 1, in the same kernels mode. The plan puts the
references first (conditions.py), so in one process they are always decoded before the batches that
need them; with --workers a helper is sent a batch only once its references are in (workers.py), and
the references travel with it. A condition whose references are missing decodes to the end, as
without --fail-fast.
"""

from nondet.probes.core.conditions import Condition
from nondet.probes.core.settled import StopRule

Steps = list[dict]


class FailFast:
    def __init__(self, rule_text: str) -> None:
        self.rule = StopRule.parse(rule_text)
        self.references: dict[tuple[str, int], Steps] = {}  # (kernels, prompt id) -> the reference's steps

    def record(self, condition: Condition, rows: dict[int, Steps]) -> None:
        """A decoded condition: kept when it is a reference."""
        if condition.is_reference and condition.positions[0] in rows:
            self.references[(condition.kernels, condition.prompt_id)] = rows[condition.positions[0]]

    def ready(self, condition: Condition) -> bool:
        """Whether the condition can be decoded now with its stop: a reference always, a batch once every
        target row's reference is in."""
        return condition.is_reference or all(key in self.references for key in _keys(condition))

    def settle(self, condition: Condition) -> "tuple[StopRule, dict[int, Steps]] | None":
        """(rule, {target row: reference steps}) for replay_condition (a batch, or a prefill form: each is
        judged against its prompt's reference), or None: a reference itself, or a reference not decoded yet."""
        if condition.is_reference or not self.ready(condition):
            return None
        return self.rule, {row: self.references[key] for row, key in zip(condition.positions, _keys(condition))}


def _keys(condition: Condition) -> list[tuple[str, int]]:
    """(kernels, prompt id) of each target row's reference, in the order of condition.positions."""
    if condition.row_prompts:
        return [(condition.kernels, condition.row_prompts[row]) for row in condition.positions]
    return [(condition.kernels, condition.prompt_id)] * len(condition.positions)
