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
    fail-fast = true                  # the batch axis: each batched call stops once its rows' verdicts are
                                      #   settled (identical, max-logprob-diff, min-divergence-step)
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

Any other key, a wrong type or unparseable TOML is a one-line UsageError (exit 2). Each value's own check is
in config_values.py, the axes, their requirements and the keys only some axes read in config_axes.py.
"""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nondet.errors import UsageError
from nondet.gate import config_axes as axis, config_values as value
from nondet.gate.config_axes import THRESHOLDS
from nondet.gate.config_values import DEFAULT_FORMS, DEFAULT_MICRO_BATCHES, PROMPT_KEYS
from nondet.gate.policy import Policy
from nondet.probes.static.workers import AUTO
from nondet.prompt import Prompt

CONFIG_NAMES = ("nondet.toml", "pyproject.toml")
KEYS = ("model", *PROMPT_KEYS, "batch-sizes", "positions", "runs", "max-new-tokens", "kernels",
        "dtype", "device", "threads", "workers", "load", "endpoint", "rate", "concurrency", "inject-variance", "compile",
        "cuda-graphs", "fail-fast", "prefix-cache", "chunked-prefill", "require",
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
    micro_batches: tuple[int, ...] = DEFAULT_MICRO_BATCHES  # rl trainer micro-batch sizes, one condition each
    sampler_batch: int = 8  # rl sampler prompts per batched generate call
    compile: bool = False  # decode on the compiled path (probe --compile); the batch axis's static batches
    # the batch axis's static batches with eager kernels replayed from CUDA graphs (probe --cuda-graphs), CUDA only
    cuda_graphs: bool = False
    # the batch axis: each batched call stops once every compared row's verdict is settled (probe's fail_fast,
    # core/settled.py); a failing gate ends sooner, its streams cut where they were decided
    fail_fast: bool = False
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
    label = value.Labels(_where(source), set(given))
    values = {**_check_keys(file_values, label.where), **given}
    if source is not None and isinstance(file_values.get("model"), str) and "model" not in given:
        values["model"] = _relative_to(file_values["model"], source.parent)
    settings = GateSettings(
        model=value.typed(values, "model", str, label),
        prompts=value.prompts(given, file_values, source, label),
        batch_sizes=value.batch_sizes(values.get("batch-sizes"), label),
        positions=value.typed(values, "positions", str, label) or "auto",
        runs=value.typed(values, "runs", int, label),
        max_new_tokens=value.positive(values, "max-new-tokens", 120, label),
        kernels=value.typed(values, "kernels", str, label) or "default",
        dtype=value.typed(values, "dtype", str, label) or "bfloat16",
        device=value.typed(values, "device", str, label) or "cpu",
        threads=value.positive(values, "threads", None, label),  # 0 would leave torch's count while config says 0
        workers=value.workers(values, label),
        load=value.typed(values, "load", str, label) or "static",
        endpoint=value.typed(values, "endpoint", str, label),
        rate=value.typed(values, "rate", float, label),
        concurrency=value.typed(values, "concurrency", int, label),
        inject_variance=value.flag(values, "inject-variance", label) if "inject-variance" in values else None,
        compile=value.flag(values, "compile", label),
        cuda_graphs=value.flag(values, "cuda-graphs", label),
        fail_fast=value.flag(values, "fail-fast", label),
        prefill=value.prefill(values, label),
        policy=axis.policy(given, file_values, label.where),
        axes=axis.axes(given, file_values),
        speculative_forms=value.forms(values, label),
        speculative_policy=axis.axis_policy("speculative", given, file_values, label.where),
        rl_policy=axis.axis_policy("rl", given, file_values, label.where),
        micro_batches=value.micro_batches(values.get("micro-batch"), label),
        sampler_batch=value.positive(values, "sampler-batch", 8, label),
        source=str(source) if source else "",
    )
    axis.check_axis_keys_used(given, file_values, settings.axes, label)  # after each value's own check
    return settings


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"cannot parse {path}: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 by its specification
        raise UsageError(f"cannot read config file {path}: not UTF-8 (byte {exc.start})") from None


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
