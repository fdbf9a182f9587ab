"""Which axes a gate runs (batch, speculative, rl), each axis's requirement, and the keys only some axes read.

A flag that names an axis (--require or a threshold flag: batch; --speculative FORMS; --rl or --max-kl) runs
the axes the flags name; else the file's keys name them; none named: batch, identical (gate/config.py)."""

from typing import Any

from nondet.errors import UsageError
from nondet.gate.policy import Policy

THRESHOLDS = ("max-distinct", "min-divergence-step", "max-logprob-diff", "max-flip-rate")
AXIS_KEYS = {  # axis -> the keys (file) or flags that name it
    "batch": ("require", *THRESHOLDS),
    "speculative": ("speculative", "speculative-forms"),
    "rl": ("rl", "max-kl"),
}

# keys only some axes read (the others never see them): given to a gate that runs none of those axes,
# they would be ignored silently. "positions" / "runs" on the speculative axis are refused by the probe itself.
AXIS_ONLY_KEYS = {
    **{key: ("batch",) for key in ("batch-sizes", "positions", "runs", "workers", "rate", "concurrency",
                                   "cuda-graphs", "fail-fast", "prefix-cache", "chunked-prefill")},
    "compile": ("batch", "speculative"),  # the rl axis samples and trains eager
    **{key: ("rl",) for key in ("micro-batch", "sampler-batch")},
}


def check_axis_keys_used(flags: dict[str, Any], file_values: dict[str, Any], axes: tuple[str, ...],
                          label) -> None:
    """Each key of AXIS_ONLY_KEYS given where none of its axes runs is refused. A file's keys may serve its
    own axes while flags pick others, so only the layer that names the axes is held to this."""
    named_by_flags = any(_names(flags.get(k)) for keys in AXIS_KEYS.values() for k in keys)
    for key, readers in AXIS_ONLY_KEYS.items():
        if any(axis in axes for axis in readers):
            continue
        layer = flags if key in flags or named_by_flags else file_values
        if layer.get(key) is None:
            continue
        why = " (the speculative axis runs at batch size 1)" if key == "batch-sizes" and "speculative" in axes else ""
        also = ", or add --require identical to gate the batch axis too" if "batch" in readers else ""
        axis = f"{' and '.join(readers)} {'axes' if len(readers) > 1 else 'axis'}"
        raise UsageError(f"{label(key)} applies to the {axis}, which this gate does not run "
                         f"(axes: {', '.join(axes)}){why}; drop it{also}")


def policy(flags: dict[str, Any], file_values: dict[str, Any], where: str) -> Policy:
    """The requirement from the flags if they name one, else from the file, else identical."""
    for layer, prefix in ((flags, "--"), (file_values, "")):
        named = [k for k in ("require", *THRESHOLDS) if layer.get(k) is not None]
        origin = "" if prefix else f"{where}: "
        if len(named) > 1:
            raise UsageError(f"{origin}give one requirement, not {' and '.join(prefix + n for n in named)}")
        if named:
            return _one_policy(named[0], layer[named[0]], origin)
    return Policy()


def _one_policy(key: str, value, prefix: str, axis: str = "batch") -> Policy:
    try:
        return _policy_of(key, value, axis)
    except UsageError as exc:
        raise UsageError(f"{prefix}{exc}") from None


def _policy_of(key: str, value, axis: str = "batch") -> Policy:
    """require/speculative/rl = "REQUIREMENT" (a string), or a threshold key = a number."""
    if key in ("require", "speculative", "rl"):
        if not isinstance(value, str):
            example = "'identical' or 'max-kl = 0.001'" if axis == "rl" else "'identical'"
            raise UsageError(f"{key} must be a string such as {example}, not {value!r}")
        return Policy.parse(value, axis)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{key} must be a number, not {value!r}")
    return Policy(key, float(value), axis)


def axes(flags: dict[str, Any], file_values: dict[str, Any]) -> tuple[str, ...]:
    """The axes the flags name, else those the file names, else batch."""
    for layer in (flags, file_values):
        named = tuple(axis for axis, keys in AXIS_KEYS.items() if any(_names(layer.get(k)) for k in keys))
        if named:
            return named
    return ("batch",)


def _names(value) -> bool:
    """A flag or key names its axis when given: any value but None and --rl's False (0 counts: --max-kl 0)."""
    return value is not None and value is not False


def axis_policy(axis: str, flags: dict[str, Any], file_values: dict[str, Any], where: str) -> Policy:
    """speculative = "REQUIREMENT" (file); rl = "REQUIREMENT" or max-kl = X (--max-kl over the file)."""
    if flags.get("max-kl") is not None and axis == "rl":
        return _one_policy("max-kl", flags["max-kl"], "", axis)
    keys = [k for k in (axis, "max-kl" if axis == "rl" else "") if k and file_values.get(k) is not None]
    if len(keys) > 1:
        raise UsageError(f"{where}: give one rl requirement, not rl and max-kl")
    if not keys:
        return Policy(axis=axis)
    return _one_policy(keys[0], file_values[keys[0]], f"{where}: ", axis)
