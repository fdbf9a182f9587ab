"""Build the token batch of one condition: the targets in their rows, fillers elsewhere.

Same-length fillers are cut or repeated to exactly the target's token count, so the batch
needs no padding and nothing but the batch composition changes. Ragged fillers have other
lengths and the batch is left-padded: a separate, labelled condition. Every-row-a-target
conditions (conditions.py: rows, padded) put a prompt in each row: `rows` batches hold
prompts of one token length (no padding); `padded` ones are left-padded, a named condition.
"""

from dataclasses import dataclass

from nondet.errors import UsageError
from nondet.probes.core.conditions import Condition
from nondet.probes.core.chat import prompt_ids


@dataclass
class Batch:
    input_ids: list[list[int]]  # [batch, seq] left-padded token ids
    attention_mask: list[list[int]]  # [batch, seq] 1 = real token
    target_rows: tuple[int, ...]
    # the prefill axis: offsets where the prompt's prefill is cut (core/prefill.py; one row, unpadded);
    # () = one prefill, in generate
    splits: tuple[int, ...] = ()


def tokenize_inputs(tokenizer, prompt: str, fillers) -> tuple[list[int], list[list[int]]]:
    """Token ids of the target and of each filler text, each as its own request (chat.prompt_ids: plain text
    with the tokenizer's BOS where it adds one, a chat-formatted prompt as rendered).

    Fillers that tokenize to nothing are dropped; with none left the target fills the batch.
    Probe, bisect and the in-memory probe all build their batches from this, so bisect
    rebuilds exactly the batch the probe ran.
    """
    target = prompt_ids(tokenizer, prompt)
    if not target:  # an empty prompt, or a tokenizer saved without its vocabulary (generate would crash)
        raise UsageError(f"the prompt {prompt[:40]!r} tokenizes to no tokens; give a non-empty prompt, or check "
                         "that the model directory holds its tokenizer's vocabulary (tokenizer.json)")
    ids = [prompt_ids(tokenizer, f) for f in fillers]
    return target, [f for f in ids if f] or [target]


def build_batch(condition: Condition, target: list[int], fillers: list[list[int]],
                pad_id: int, prompts: list[list[int]] | None = None) -> Batch:
    """target: the token ids of the condition's prompt; prompts: every prompt's ids, by prompt id
    (needed by, and only read for, a condition with row_prompts)."""
    if condition.row_prompts or condition.fillers in ("prompts", "padded"):
        return _prompt_rows(condition, fillers, pad_id, prompts)
    if condition.splits:  # the prefill axis: the prompt alone, its prefill cut into pieces
        return Batch([list(target)], [[1] * len(target)], (0,), condition.splits)
    rows: list[list[int]] = []
    filler_index = condition.trial  # a later trial: the rotation starts further on
    for row in range(condition.batch_size):
        if row in condition.positions:
            rows.append(list(target))
            continue
        source = fillers[filler_index % len(fillers)]
        length = _ragged_length(len(target), filler_index) if condition.fillers == "ragged" else len(target)
        rows.append(fit_length(source, length))
        filler_index += 1
    return _left_pad(rows, pad_id, condition.positions)


def _prompt_rows(condition: Condition, fillers: list[list[int]], pad_id: int,
                 prompts: list[list[int]] | None) -> Batch:
    """Each row its prompt (row_prompts); filler rows (-1) have the longest prompt's length."""
    if not condition.row_prompts or prompts is None:  # a reader that predates rows conditions
        raise UsageError(f"condition {condition.condition_id} holds several prompts (every row a target); rebuilding "
                         "it needs its row_prompts and every prompt's tokens, which this reader does not pass; "
                         "probe with --positions ends (one prompt per batch) to replay a condition")
    length = max(len(prompts[k]) for k in condition.row_prompts if k >= 0)
    fill = iter(range(condition.trial, condition.trial + condition.batch_size))
    rows = [list(prompts[k]) if k >= 0 else fit_length(fillers[next(fill) % len(fillers)], length)
            for k in condition.row_prompts]
    return _left_pad(rows, pad_id, condition.positions)


def batch_shape(condition: Condition, target: list[int], fillers: list[list[int]],
                prompts: list[list[int]] | None = None) -> tuple:
    """What a compiled decode's graphs depend on: (rows, padded prompt length, prefill cuts). Two
    conditions of one shape reuse one compiled graph and CUDA graph (core/compiled.py)."""
    batch = build_batch(condition, target, fillers, 0, prompts)
    return len(batch.input_ids), len(batch.input_ids[0]), batch.splits


def fit_length(tokens: list[int], length: int) -> list[int]:
    """Repeat or cut a filler so it has exactly `length` tokens."""
    if not tokens:
        raise ValueError("a filler prompt tokenized to no tokens")
    repeated = tokens * (length // len(tokens) + 1)
    return repeated[:length]


_RAGGED_FACTORS = (0.5, 1.75, 0.75, 2.0, 1.25)  # filler lengths, x the target's


def _ragged_length(target_len: int, filler_index: int) -> int:
    # Alternate shorter and longer than the target, so the target row is padded too.
    return max(1, round(target_len * _RAGGED_FACTORS[filler_index % len(_RAGGED_FACTORS)]))


def longest_ragged_row(target_len: int, batch_size: int) -> int:
    """The longest row of a ragged batch of this size around a target of target_len tokens (its fillers are
    at most batch_size - 1): what must fit the model's context with the tokens to generate."""
    fillers = range(min(batch_size - 1, len(_RAGGED_FACTORS)))
    return max([target_len, *(_ragged_length(target_len, i) for i in fillers)])


def _left_pad(rows: list[list[int]], pad_id: int, targets: tuple[int, ...]) -> Batch:
    width = max(map(len, rows))
    ids = [[pad_id] * (width - len(r)) + r for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    return Batch(ids, mask, targets)
