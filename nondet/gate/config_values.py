"""Each gate setting's value read and checked (gate/config.py resolves them): a wrong one is one line that
names its flag ('--max-new-tokens') or its file's key ('nondet.toml: max-new-tokens'), exit 2."""

from pathlib import Path
from typing import Any

from nondet.errors import UsageError
from nondet.probes.static.workers import AUTO
from nondet.prompt import Prompt

DEFAULT_BATCH_SIZES = (1, 8, 16)  # the demo model's tokens flip at bs 8/16 near step 93
DEFAULT_FORMS = "ngram:4,self:4"  # prompt lookup and the model as its own draft
DEFAULT_MICRO_BATCHES = (1, 4, 8)  # the rl trainer's micro-batch sizes, one condition each
PROMPT_KEYS = ("prompt", "prompts", "prompts-file")  # one of them per layer (flags: --prompt or --prompts)
TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list"}


class Labels:
    """How an error names a setting: '--max-new-tokens' (a flag) or 'nondet.toml: max-new-tokens'."""

    def __init__(self, where: str, flag_keys: set[str]) -> None:
        self.where, self.flag_keys = where, flag_keys

    def __call__(self, key: str) -> str:
        return f"--{key}" if key in self.flag_keys else f"{self.where}: {key}"


def typed(values: dict[str, Any], key: str, kind: type, label: Labels):
    value = values.get(key)
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UsageError(f"{label(key)} must be {TYPE_NAMES[kind]}, not {value!r}")
    return value


def flag(values: dict[str, Any], key: str, label: Labels) -> bool:
    value = values.get(key, False)
    if not isinstance(value, bool):
        raise UsageError(f"{label(key)} must be true or false, not {value!r}")
    return value


def workers(values: dict[str, Any], label: Labels) -> int | str:
    """workers: a count >= 1 or "auto" (from the flag, already checked, or the file)."""
    value = values.get("workers")
    if value == AUTO:
        return value
    if isinstance(value, str) and value.isdigit():  # the file's "2" (the flag arrives as a number)
        value = int(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"{label('workers')} must be an integer >= 1 or \"auto\", not {value!r}")
    return AUTO if value is None else value


def positive(values: dict[str, Any], key: str, default: int | None, label: Labels) -> int | None:
    value = typed(values, key, int, label)
    if value is not None and value < 1:
        raise UsageError(f"{label(key)} must be >= 1, not {value}")
    return default if value is None else value


def prompts(flags: dict[str, Any], file_values: dict[str, Any], source: Path | None,
             label: Labels) -> tuple[Prompt, ...]:
    """The flags' prompts (--prompt, repeatable, or --prompts FILE) replace the file's (prompt,
    prompts or prompts-file); each layer gives them one way."""
    if flags.get("prompts") is not None and flags.get("prompts-file") is not None:
        raise UsageError("give either --prompt or --prompts FILE, not both")
    from_flags = any(flags.get(k) is not None for k in PROMPT_KEYS)
    layer = flags if from_flags else file_values
    named = [k for k in PROMPT_KEYS if layer.get(k) is not None]
    if len(named) > 1:
        raise UsageError(f"{label.where}: give one of prompt, prompts, prompts-file, not {' and '.join(named)}")
    if not named:
        return ()
    if named[0] == "prompts-file":  # a file's path is relative to that file, a flag's to the cwd
        base = source.parent if source is not None and not from_flags else Path()
        return _prompts_file(layer["prompts-file"], base, label)
    return _prompt_list(named[0], layer[named[0]], from_flags, label)


def _prompts_file(value, base: Path, label: Labels) -> tuple[Prompt, ...]:
    """The one prompt-file reader of every command (nondet/prompt_file.py): JSONL or plain lines."""
    from nondet.prompt_file import read_prompt_file

    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{label('prompts-file')} must be a file path, not {value!r}")
    return read_prompt_file(base / value)


def _prompt_list(key: str, value, from_flags: bool, label: Labels) -> tuple[str, ...]:
    prompts = [value] if key == "prompt" and isinstance(value, str) else value
    if isinstance(prompts, list) and all(isinstance(p, str) and p.strip() for p in prompts):
        return tuple(prompts)
    if from_flags:
        raise UsageError("--prompt is empty")
    raise UsageError(f"{label(key)} must be " + ("non-empty text" if key == "prompt" else "a list of non-empty strings"))


def batch_sizes(value, label: Labels) -> tuple[int, ...] | None:
    from nondet.probes.core.conditions import parse_batch_sizes  # pure Python, no torch

    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = ",".join(map(str, value))
    if not isinstance(value, str):
        raise UsageError(f"{label('batch-sizes')} must be a list of integers or a string like '1,8,16'")
    try:
        sizes = parse_batch_sizes(value)
    except UsageError as exc:  # its message names the flag; a file's value is named by the file
        raise UsageError(f"{label('batch-sizes')}: {str(exc).removeprefix('--batch-sizes: ')}") from None
    if len(sizes) < 2:
        raise UsageError(f"{label('batch-sizes')} needs a size > 1 (1 alone is only the reference)")
    return sizes


def prefill(values: dict[str, Any], label: Labels) -> tuple[str, ...]:
    """prefix-cache / chunked-prefill: "auto", "8,16", 8 or [8, 16] -> the probe's prefill forms."""
    from nondet.probes.core.prefill import parse_prefill

    def text(key: str) -> str | None:
        value = values.get(key)
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(map(str, value))
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return typed(values, key, str, label)

    try:
        return parse_prefill(text("prefix-cache"), text("chunked-prefill"))
    except UsageError as exc:  # its message names the flag; a file's value is named by the file
        flag, _, rest = str(exc).partition(": ")
        raise UsageError(f"{label(flag.removeprefix('--'))}: {rest}") from None


def forms(values: dict[str, Any], label: Labels) -> str:
    """The speculative forms, checked now (pure Python): before any model loads."""
    from nondet.probes.speculative.speculation import parse_speculative

    forms = typed(values, "speculative-forms", str, label)
    if forms is None:
        return DEFAULT_FORMS
    try:
        parsed = parse_speculative(forms)
    except UsageError as exc:  # its message names the flag; a file's value is named by the file
        raise UsageError(f"{label('speculative-forms')}: {str(exc).removeprefix('--speculative: ')}") from None
    if not parsed:
        raise UsageError(f"{label('speculative-forms')} needs at least one form, e.g. {DEFAULT_FORMS}")
    return forms


def micro_batches(value, label: Labels) -> tuple[int, ...]:
    if value is None:
        return DEFAULT_MICRO_BATCHES
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            value = None
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise UsageError(f"{label('micro-batch')} must be sizes >= 1, as [1, 4, 8] or '1,4,8'")
    return tuple(value)
