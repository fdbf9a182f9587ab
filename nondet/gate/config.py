"""The gate's settings: flags over a config file over defaults.

The config file is `--config FILE`, or else the first `nondet.toml` or `pyproject.toml`
(its `[tool.nondet]` table) found from the working directory upwards, stopping at the
repository root (a directory holding `.git`). `nondet.toml` wins when both sit in one
directory. Keys (TOML, kebab-case):

    model = "path/or/hub-id"          # relative paths are relative to the config file
    prompts = ["Tell me about Richard Feynman"]   # or prompt = "...", or prompts-file = "prompts.jsonl"
                                      #   (the format of `nondet probe --prompts`, relative to this file)
    batch-sizes = [1, 8, 16]          # or "1,8,16" / "1-16"
    positions = "auto"                # auto | rows | padded | ends | first | last | all (auto: every
                                      #   row a target with several prompts, one probe; else ends)
    runs = 9                          # spread N replays over the batches instead
    max-new-tokens = 120
    kernels = "batch-invariant"       # default | batch-invariant
    dtype = "bfloat16"
    device = "cpu"
    threads = 2
    workers = 2                       # static batches on the CPU: conditions decoded by N processes at once
                                      #   (default "auto": more than 1 on a long enough sweep)
    load = "static"                   # static | continuous (in-process continuous batching)
    endpoint = "http://127.0.0.1:8000"   # probe a live OpenAI-compatible server instead
    rate = 0.5                        # filler arrivals (per engine step / per second on a server)
    concurrency = 8                   # fillers in the engine at once / copies in flight
    inject-variance = false           # self-test: one norm made batch-variant; the gate must fail
    cuda-graphs = true                # the batch axis from CUDA graphs of the eager kernels (probe --cuda-graphs)
    require = "identical"             # or ONE of: max-distinct = 2, min-divergence-step = 50,
                                      #            max-logprob-diff = 1e-3, max-flip-rate = 0.01
    speculative = "identical"         # the speculative axis: each form vs plain greedy (any requirement
                                      #   above, as a string: "max-logprob-diff = 1e-3")
    speculative-forms = "ngram:4,self:4"   # the forms it probes (the default), as `--speculative`
    rl = "identical"                  # the rl axis (`nondet rl`): every trainer micro-batch's logprobs
    max-kl = 1e-6                     #   bit-identical to the sampler's, OR their k3 KL at most X
    micro-batch = [1, 4, 8]           # the rl trainer's micro-batch sizes (or "1,4,8")
    sampler-batch = 8                 # the rl sampler's batch size

Axes: a flag that names an axis (--require or a threshold flag: batch; --speculative FORMS;
--rl or --max-kl) runs the axes the flags name; else the file's keys name them (require or a
threshold: batch; speculative or speculative-forms; rl or max-kl); none named: batch, identical.

Any other key, a wrong type or unparseable TOML is a one-line UsageError (exit 2).
"""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nondet.errors import UsageError
from nondet.gate.policy import Policy
from nondet.probes.static.workers import AUTO
from nondet.prompt import Prompt

THRESHOLDS = ("max-distinct", "min-divergence-step", "max-logprob-diff")
CONFIG_NAMES = ("nondet.toml", "pyproject.toml")
AXIS_KEYS = {  # axis -> the keys (file) or flags that name it
    "batch": ("require", *THRESHOLDS),
    "speculative": ("speculative", "speculative-forms"),
    "rl": ("rl", "max-kl"),
}
DEFAULT_BATCH_SIZES = (1, 8, 16)  # the demo model's tokens flip at bs 8/16 near step 93
DEFAULT_FORMS = "ngram:4,self:4"  # prompt lookup and the model as its own draft
PROMPT_KEYS = ("prompt", "prompts", "prompts-file")  # one of them per layer (flags: --prompt or --prompts)
KEYS = ("model", *PROMPT_KEYS, "batch-sizes", "positions", "runs", "max-new-tokens", "kernels",
        "dtype", "device", "threads", "workers", "load", "endpoint", "rate", "concurrency", "inject-variance", "compile",
        "cuda-graphs", "prefix-cache", "chunked-prefill", "require",
        *THRESHOLDS, "speculative", "speculative-forms", "rl", "max-kl", "micro-batch", "sampler-batch")


@dataclass(frozen=True)
class GateSettings:
    model: str | None = None  # local dir or hub id; None = the embedded demo model
    # () = the probe's default prompt; each prompt is its own probe; a Chat (a prompts file's {"messages": ...}
    # line) is probed through the chat template
    prompts: tuple[Prompt, ...] = ()
    # None = not given: static batches take DEFAULT_BATCH_SIZES, and a source that reads no batch sizes (a
    # server, the continuous engine) gets none, where sizes the user gave are refused for it
    batch_sizes: tuple[int, ...] | None = None
    positions: str = "auto"  # target rows: auto = every row a target with several prompts (rows), else ends
    runs: int | None = None  # N target replays spread over the batches (overrides positions)
    max_new_tokens: int = 120  # long enough for the demo model's first token flip
    kernels: str = "default"  # default | batch-invariant: the mode the repository promises
    dtype: str = "bfloat16"
    device: str = "cpu"
    threads: int | None = None  # torch CPU threads; results depend on it, so CI should pin it
    # static batches on the CPU: processes decoding conditions at once; "auto" (the default): more than one only
    # for a sweep long enough to pay for the helpers' start-up (probes/static/workers.py, auto_workers.py)
    workers: int | str = AUTO
    load: str = "static"  # static batches | continuous (the engine in process); see nondet probe
    endpoint: str | None = None  # a live OpenAI-compatible server to probe (the "server" load)
    rate: float | None = None  # filler arrival rate under load (None = the probe's default)
    concurrency: int | None = None  # fillers in the engine / copies in flight (None = default)
    # self-test: one norm made batch-variant on purpose, the gate must fail; None = on for the trained
    # demo model only (as in nondet probe), off for every other model
    inject_variance: bool | None = None
    policy: Policy = field(default_factory=Policy)  # the batch axis's requirement
    axes: tuple[str, ...] = ("batch",)  # what the gate checks, in this order: batch, speculative, rl
    speculative_forms: str = DEFAULT_FORMS  # the forms the speculative axis probes, as --speculative
    speculative_policy: Policy = field(default_factory=lambda: Policy(axis="speculative"))
    rl_policy: Policy = field(default_factory=lambda: Policy(axis="rl"))
    micro_batches: tuple[int, ...] = (1, 4, 8)  # rl trainer micro-batch sizes, one condition each
    sampler_batch: int = 8  # rl sampler prompts per batched generate call
    compile: bool = False  # decode on the compiled path (probe --compile); the batch axis's static batches
    # the batch axis's static batches with eager kernels replayed from CUDA graphs (probe --cuda-graphs), CUDA only
    cuda_graphs: bool = False
    # the batch axis also runs the prefill splits (probe --prefix-cache / --chunked-prefill), judged by its policy
    prefill: tuple[str, ...] = ()
    source: str = ""  # the config file the settings came from ("" = flags and defaults only)


def find_config(start: Path) -> Path | None:
    """nondet.toml, or a pyproject.toml with [tool.nondet], from start up to the repository root."""
    for directory in (start.resolve(), *start.resolve().parents):
        for name in CONFIG_NAMES:
            path = directory / name
            if path.is_file() and (name == "nondet.toml" or "nondet" in _read_toml(path).get("tool", {})):
                return path
        if (directory / ".git").exists():
            return None
    return None


def load_config(path: Path) -> dict[str, Any]:
    """The nondet table of one file: [tool.nondet] in pyproject.toml, the top level otherwise."""
    data = _read_toml(path)
    if path.name != "pyproject.toml":
        return data
    table = data.get("tool", {}).get("nondet", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.nondet] must be a table")
    return table


def resolve(flags: dict[str, Any], file_values: dict[str, Any], source: Path | None = None) -> GateSettings:
    """Settings from flags (None = not given) over the file's values over the defaults."""
    given = {k: v for k, v in flags.items() if v is not None}
    label = _Labels(_where(source), set(given))
    values = {**_check_keys(file_values, label.where), **given}
    if source is not None and isinstance(file_values.get("model"), str) and "model" not in given:
        values["model"] = _relative_to(file_values["model"], source.parent)
    settings = GateSettings(
        model=_typed(values, "model", str, label),
        prompts=_prompts(given, file_values, source, label),
        batch_sizes=_batch_sizes(values.get("batch-sizes"), label),
        positions=_typed(values, "positions", str, label) or "auto",
        runs=_typed(values, "runs", int, label),
        max_new_tokens=_positive(values, "max-new-tokens", 120, label),
        kernels=_typed(values, "kernels", str, label) or "default",
        dtype=_typed(values, "dtype", str, label) or "bfloat16",
        device=_typed(values, "device", str, label) or "cpu",
        threads=_positive(values, "threads", None, label),  # 0 would leave torch's count while config says 0
        workers=_workers(values, label),
        load=_typed(values, "load", str, label) or "static",
        endpoint=_typed(values, "endpoint", str, label),
        rate=_typed(values, "rate", float, label),
        concurrency=_typed(values, "concurrency", int, label),
        inject_variance=_flag(values, "inject-variance", label) if "inject-variance" in values else None,
        compile=_flag(values, "compile", label),
        cuda_graphs=_flag(values, "cuda-graphs", label),
        prefill=_prefill(values, label),
        policy=_policy(given, file_values, label.where),
        axes=_axes(given, file_values),
        speculative_forms=_forms(values, label),
        speculative_policy=_axis_policy("speculative", given, file_values, label.where),
        rl_policy=_axis_policy("rl", given, file_values, label.where),
        micro_batches=_micro_batches(values.get("micro-batch"), label),
        sampler_batch=_positive(values, "sampler-batch", 8, label),
        source=str(source) if source else "",
    )
    _check_axis_keys_used(given, file_values, settings.axes, label)  # after each value's own check
    return settings


class _Labels:
    """How an error names a setting: '--max-new-tokens' (a flag) or 'nondet.toml: max-new-tokens'."""

    def __init__(self, where: str, flag_keys: set[str]) -> None:
        self.where, self.flag_keys = where, flag_keys

    def __call__(self, key: str) -> str:
        return f"--{key}" if key in self.flag_keys else f"{self.where}: {key}"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"cannot parse {path}: {exc}") from None


def _where(source: Path | None) -> str:
    if source is None:
        return "defaults"
    return f"{source} [tool.nondet]" if source.name == "pyproject.toml" else str(source)


def _check_keys(values: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(KEYS)}")
    return values


def _relative_to(model: str, base: Path) -> str:
    """A model path in a config file is relative to that file; hub ids stay as they are."""
    candidate = base / model
    return str(candidate) if model.startswith(".") or candidate.exists() else model


def _typed(values: dict[str, Any], key: str, kind: type, label: _Labels):
    value = values.get(key)
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UsageError(f"{label(key)} must be {_TYPE_NAMES[kind]}, not {value!r}")
    return value


def _flag(values: dict[str, Any], key: str, label: _Labels) -> bool:
    value = values.get(key, False)
    if not isinstance(value, bool):
        raise UsageError(f"{label(key)} must be true or false, not {value!r}")
    return value


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list"}


def _workers(values: dict[str, Any], label: _Labels) -> int | str:
    """workers: a count >= 1 or "auto" (from the flag, already checked, or the file)."""
    value = values.get("workers")
    if value == AUTO:
        return value
    if isinstance(value, str) and value.isdigit():  # the file's "2" (the flag arrives as a number)
        value = int(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"{label('workers')} must be an integer >= 1 or \"auto\", not {value!r}")
    return AUTO if value is None else value


def _positive(values: dict[str, Any], key: str, default: int | None, label: _Labels) -> int | None:
    value = _typed(values, key, int, label)
    if value is not None and value < 1:
        raise UsageError(f"{label(key)} must be >= 1, not {value}")
    return default if value is None else value


def _prompts(flags: dict[str, Any], file_values: dict[str, Any], source: Path | None,
             label: _Labels) -> tuple[Prompt, ...]:
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


def _prompts_file(value, base: Path, label: _Labels) -> tuple[Prompt, ...]:
    """The one prompt-file reader of every command (nondet/prompt_file.py): JSONL or plain lines."""
    from nondet.prompt_file import read_prompt_file

    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{label('prompts-file')} must be a file path, not {value!r}")
    return read_prompt_file(base / value)


def _prompt_list(key: str, value, from_flags: bool, label: _Labels) -> tuple[str, ...]:
    prompts = [value] if key == "prompt" and isinstance(value, str) else value
    if isinstance(prompts, list) and all(isinstance(p, str) and p.strip() for p in prompts):
        return tuple(prompts)
    if from_flags:
        raise UsageError("--prompt is empty")
    raise UsageError(f"{label(key)} must be " + ("non-empty text" if key == "prompt" else "a list of non-empty strings"))


def _batch_sizes(value, label: _Labels) -> tuple[int, ...] | None:
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


# keys only some axes read (the others never see them): given to a gate that runs none of those axes,
# they would be ignored silently. "positions" / "runs" on the speculative axis are refused by the probe itself.
AXIS_ONLY_KEYS = {
    **{key: ("batch",) for key in ("batch-sizes", "positions", "runs", "workers", "rate", "concurrency",
                                   "cuda-graphs", "prefix-cache", "chunked-prefill")},
    "compile": ("batch", "speculative"),  # the rl axis samples and trains eager
    **{key: ("rl",) for key in ("micro-batch", "sampler-batch")},
}


def _check_axis_keys_used(flags: dict[str, Any], file_values: dict[str, Any], axes: tuple[str, ...],
                          label: _Labels) -> None:
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


def _policy(flags: dict[str, Any], file_values: dict[str, Any], where: str) -> Policy:
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


def _axes(flags: dict[str, Any], file_values: dict[str, Any]) -> tuple[str, ...]:
    """The axes the flags name, else those the file names, else batch."""
    for layer in (flags, file_values):
        named = tuple(axis for axis, keys in AXIS_KEYS.items() if any(_names(layer.get(k)) for k in keys))
        if named:
            return named
    return ("batch",)


def _names(value) -> bool:
    """A flag or key names its axis when given: any value but None and --rl's False (0 counts: --max-kl 0)."""
    return value is not None and value is not False


def _axis_policy(axis: str, flags: dict[str, Any], file_values: dict[str, Any], where: str) -> Policy:
    """speculative = "REQUIREMENT" (file); rl = "REQUIREMENT" or max-kl = X (--max-kl over the file)."""
    if flags.get("max-kl") is not None and axis == "rl":
        return _one_policy("max-kl", flags["max-kl"], "", axis)
    keys = [k for k in (axis, "max-kl" if axis == "rl" else "") if k and file_values.get(k) is not None]
    if len(keys) > 1:
        raise UsageError(f"{where}: give one rl requirement, not rl and max-kl")
    if not keys:
        return Policy(axis=axis)
    return _one_policy(keys[0], file_values[keys[0]], f"{where}: ", axis)


def _prefill(values: dict[str, Any], label: _Labels) -> tuple[str, ...]:
    """prefix-cache / chunked-prefill: "auto", "8,16", 8 or [8, 16] -> the probe's prefill forms."""
    from nondet.probes.core.prefill import parse_prefill

    def text(key: str) -> str | None:
        value = values.get(key)
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(map(str, value))
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return _typed(values, key, str, label)

    try:
        return parse_prefill(text("prefix-cache"), text("chunked-prefill"))
    except UsageError as exc:  # its message names the flag; a file's value is named by the file
        flag, _, rest = str(exc).partition(": ")
        raise UsageError(f"{label(flag.removeprefix('--'))}: {rest}") from None


def _forms(values: dict[str, Any], label: _Labels) -> str:
    """The speculative forms, checked now (pure Python): before any model loads."""
    from nondet.probes.speculative.speculation import parse_speculative

    forms = _typed(values, "speculative-forms", str, label)
    if forms is None:
        return DEFAULT_FORMS
    try:
        parsed = parse_speculative(forms)
    except UsageError as exc:  # its message names the flag; a file's value is named by the file
        raise UsageError(f"{label('speculative-forms')}: {str(exc).removeprefix('--speculative: ')}") from None
    if not parsed:
        raise UsageError(f"{label('speculative-forms')} needs at least one form, e.g. {DEFAULT_FORMS}")
    return forms


def _micro_batches(value, label: _Labels) -> tuple[int, ...]:
    if value is None:
        return GateSettings.micro_batches
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            value = None
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise UsageError(f"{label('micro-batch')} must be sizes >= 1, as [1, 4, 8] or '1,4,8'")
    return tuple(value)
