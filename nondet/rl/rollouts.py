"""Rollouts exported from an RL framework: `--rollouts FILE.jsonl`, one sequence per line.

    {"prompt_ids": [151644, 872, ...], "completion_ids": [785, 3974, ...],
     "logprobs": [-0.31, -1.2, ...]}      # the sampler's, one per completion id

A logprob may be a float or a float.hex string (exact). A bad line is one UsageError (exit 2)
naming the file, the line and the problem, raised before any forward pass runs.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from nondet.errors import UsageError


class RolloutsError(UsageError):
    """A rollouts file that cannot be replayed (exit 2)."""


@dataclass(frozen=True)
class Rollout:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # the sampler's, one per completion id


def read_rollouts(path: str) -> list[Rollout]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RolloutsError(f"cannot read rollouts file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    rollouts = [_rollout(line, f"rollouts {path} line {i + 1}") for i, line in enumerate(lines) if line.strip()]
    if not rollouts:
        raise RolloutsError(f"rollouts file {path} has no rollouts")
    return rollouts


def check_vocabulary(rollouts: list[Rollout], vocab_size: int, path: str) -> None:
    """Every token id must index the model's embedding (checked before any forward pass)."""
    for i, r in enumerate(rollouts):
        for name, ids in (("prompt", r.prompt_ids), ("completion", r.completion_ids)):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise RolloutsError(f"rollouts {path} rollout {i + 1}: {name} token {bad[0]} is out of the "
                                    f"model's vocabulary ({vocab_size} tokens); was it made with another tokenizer?")


def _rollout(line: str, where: str) -> Rollout:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RolloutsError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise RolloutsError(f"{where}: expected an object with prompt_ids, completion_ids, logprobs")
    prompt, completion = _ids(data, "prompt_ids", where), _ids(data, "completion_ids", where)
    logprobs = _logprobs(data, where)
    if len(logprobs) != len(completion):
        raise RolloutsError(f"{where}: {len(completion)} completion ids but {len(logprobs)} logprobs")
    if not prompt or not completion:
        raise RolloutsError(f"{where}: prompt_ids and completion_ids must be non-empty")
    return Rollout(tuple(prompt), tuple(completion), tuple(logprobs))


def _ids(data: dict, key: str, where: str) -> list[int]:
    ids = data.get(key)
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RolloutsError(f"{where}: {key} must be a list of token ids")
    return ids


def _logprobs(data: dict, where: str) -> list[float]:
    values = data.get("logprobs")
    if not isinstance(values, list):
        raise RolloutsError(f"{where}: logprobs must be a list of floats (or float.hex strings)")
    try:
        return [float.fromhex(v) if isinstance(v, str) else float(v) for v in values]
    except (TypeError, ValueError):
        raise RolloutsError(f"{where}: logprobs must be a list of floats (or float.hex strings)") from None


def read_prompts(path: str) -> tuple[str, ...]:
    """`--prompts FILE`: the one prompt-file format (nondet/prompt_file.py)."""
    from nondet.prompt_file import read_prompt_file

    return read_prompt_file(path)
