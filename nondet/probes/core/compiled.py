"""The compiled decode path (`probe --compile`): transformers' own compiled generate, per kernels mode.

A user who deploys a compiled model decodes with a static KV cache and a torch.compile'd forward
(on CUDA: Inductor with CUDA graphs, transformers' `CompileConfig` default "reduce-overhead"). Its
numerics are those of Inductor's kernels, not eager's, so the compiled path is a labelled path of its
own: each kernels mode's streams come from one path only, its reference included, and the summary
says which (`DecodePaths.as_summary`). On the CPU Inductor compiles too (no CUDA graphs there).

Each condition is warmed up first: the same batch, the same cache length, stopped after WARM_STEPS
decode steps, so the compile and the CUDA-graph capture of that shape fall in the warm-up, and the
condition's own call is timed apart from it. A kernels mode whose first warm-up cannot compile runs
eager with the static cache instead, and the summary names the reason; a later failure is an error,
because one comparison must never mix the two paths.
"""

import contextlib
import os
import re
import time
import weakref
from dataclasses import dataclass, field

from nondet.errors import NondetError, debug_traceback

WARM_STEPS = 4  # decode steps: dynamo compiles on the 1st, cudagraph trees warm up on the 2nd, record on the 3rd
# A speculative call on CUDA is warmed up twice: on an H100 (2026-11-26, the 8B-wide damped case) the
# call after one whole-call warm-up took 1.8-2.6x the ms per token of the calls after it, for default
# kernels and the mode alike; the calls from the third on were steady. (Our reading, not traced: cudagraph trees
# record a sequence of graphs the second time it runs, and a round's draft and verification calls
# make new sequences.)
SPECULATIVE_WARM_CALLS = {"cuda": 2}
RECOMPILE_LIMIT = 256  # one graph per batch shape and cache length per kernels mode; dynamo's default stops at 8
COMPILED, EAGER = "compiled", "eager"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # read by Inductor each time it opens its caches
# TRITON_CACHE_DIR is read by Triton at each compile. Unset, Inductor sets it for good (to its own folder) the first
# time it compiles a kernel in this process, and every Triton kernel launched after, ours too, then looks there: on
# an H200 a warm probe's first run after a cold one compiled the mode's kernels again for 8 s, since the cold run had
# compiled them before Inductor set it (docs/benchmarks.md, 2026-11-29 11:10). So compile_scope names one folder for
# all (cache_dir.triton_cache; the CLI names it for every command too).

# "0": the compiled path on CUDA without CUDA graphs (Inductor's default mode). A benchmark switch: whether a
# capture per batch shape pays at a probe's length (scripts/gpu.sh probe-cli's *-nographs runs); the label and
# the saved steps' key follow it, so the two paths' files and numbers never mix
CUDA_GRAPHS_ENV = "NONDET_CUDA_GRAPHS"


def speculative_warm_calls(device_type: str) -> int:
    """Whole calls a speculative condition is warmed up with before its measured call."""
    return SPECULATIVE_WARM_CALLS.get(device_type, 1)


def generation_fields(backend: str, device_type: str, guard_filter=None) -> dict:
    """GenerationConfig fields of the compiled path: a static cache, and transformers' compile config
    (CUDA: its default mode, CUDA graphs; other devices: Inductor's default mode, forced on).
    guard_filter (tp_layout_guard_filter): dynamo keeps only the guards it keeps; the same CUDA graphs
    are then asked for as the option that mode sets, since torch.compile takes a mode or options."""
    from transformers import CompileConfig

    cuda, graphs = device_type == "cuda", cuda_graphs(device_type)
    if guard_filter is not None:
        options = {"guard_filter_fn": guard_filter, **({"triton.cudagraphs": True} if graphs else {})}
        config = CompileConfig(backend=backend, mode=None, options=options)
    else:
        config = CompileConfig(backend=backend, mode="reduce-overhead" if graphs else "default")
    if not cuda:
        config._compile_all_devices = True  # transformers compiles generate on CUDA-like devices only
    return {"cache_implementation": "static", "compile_config": config}


# Dynamo's guards on what a tensor-parallel load fixes for the model's lifetime: each DTensor parameter's
# spec (placements, mesh) and the cells of transformers' TP forward wrappers (their ParallelStyle and
# DeviceMesh). Checking them on every decode step took 1.03 ms of host time per step on rank 0 against
# 0.13 ms at TP1 (H200, 8 layers of the 8B width, 2026-11-28); on a CPU TP2 of 4 layers 1.8 -> 0.9 ms
# (docs/benchmarks.md). The compiled TP step skips them; every other guard stays, among them what tells
# the kernels modes apart (globals such as F.linear, hooks, the torch function mode stack, our own
# forward wrappers' cells).
_WRAPPER_CELL = re.compile(r"((?:\._modules\['[^']+'\])+)\.forward\.__closure__")
_TP_CLASSES = ("torch.distributed", "transformers.distributed", "transformers.integrations.tensor_parallel")
_FILTERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its filter (None: not TP)


def tp_layout_guard_filter(model):
    """The guard filter of a tensor-parallel model (DTensor parameters), None for any other; one object
    per model, so transformers keeps one compiled call (it recompiles when the compile config changes)."""
    if model not in _FILTERS:
        _FILTERS[model] = _layout_filter(model) if _has_dtensors(model) else None
    return _FILTERS[model]


def _layout_filter(model):
    wrapped = frozenset(name for name, module in model.named_modules() if name and _tp_wrapped(module))

    def keep(entries) -> list[bool]:
        return [not (e.guard_type == "DTENSOR_SPEC_MATCH" or _wrapper_of(e.name) in wrapped) for e in entries]

    return keep


def _wrapper_of(guard_name: str) -> str | None:
    """The dotted module path whose forward's closure a guard reads ("...._modules['model']._modules['norm']
    .forward.__closure__[0]..." -> "model.norm"), or None."""
    found = _WRAPPER_CELL.search(guard_name)
    return ".".join(re.findall(r"\['([^']+)'\]", found.group(1))) if found else None


def _tp_wrapped(module) -> bool:
    """Whether the module's forward is a TP wrapper: an instance forward defined in transformers' or
    torch's distributed code, or closing over their objects (a ParallelStyle, a DeviceMesh)."""
    forward = module.__dict__.get("forward")
    if (getattr(forward, "__module__", None) or "").startswith(_TP_CLASSES):
        return True
    for cell in getattr(forward, "__closure__", None) or ():
        try:
            if type(cell.cell_contents).__module__.startswith(_TP_CLASSES):
                return True
        except ValueError:  # an empty cell
            continue
    return False


def _has_dtensors(model) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def warm_up_stop(prompt_tokens: int):
    """A stopping criterion that ends a warm-up call after WARM_STEPS new tokens (the call still
    allocates the full cache: its length comes from max_new_tokens, so the shapes are the real ones)."""
    from nondet.probes.core.stop_after import stop_after

    return stop_after(prompt_tokens, WARM_STEPS)


@contextlib.contextmanager
def compile_scope():
    """Dynamo allowed one graph per shape (every batch size and prompt length is a new one), and
    Inductor's and Triton's on-disk caches under NONDET_CACHE (inductor/, triton/), so a second probe
    of the same model and shapes starts warm after a reboot too (Inductor's default is a folder in
    /tmp), and every run finds each kernel where an earlier run compiled it (cache_dir.triton_cache); a
    TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR the user set is kept. Restored on exit, Inductor's
    own setting of Triton's folder included."""
    import torch._dynamo

    from nondet.probes.core.cache_dir import cache_root, env_default, triton_cache

    inductor = env_default(INDUCTOR_CACHE_ENV, str(cache_root() / "inductor"), lambda v: not _inductors_own(v))
    with inductor, triton_cache(), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        yield


def _inductors_own(value: str | None) -> bool:
    """Unset, or Inductor's default: importing torch's compiler writes its default folder into the
    variable, so only another value is the user's."""
    if value is None:
        return True
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch that moved it: keep whatever is set
        return False
    return os.path.abspath(value) == os.path.abspath(default_cache_dir())


def census_store(model, extra: str = ""):
    """The compiled graph census's store for this model (kernels/census_store.py), under NONDET_CACHE/census:
    with it, the mode's graphs are kept in Inductor's caches like the default kernels' graphs."""
    from nondet.kernels.census_store import CensusStore, store_key
    from nondet.probes.core.cache_dir import cache_root

    key = store_key(model.config.to_json_string(), str(model.dtype), model.device.type, extra)
    return CensusStore(cache_root() / "census" / f"{key}.jsonl", key)


def cuda_graphs(device_type: str) -> bool:
    """Whether the compiled path captures CUDA graphs: on CUDA, unless NONDET_CUDA_GRAPHS=0."""
    return device_type == "cuda" and os.environ.get(CUDA_GRAPHS_ENV, "1") != "0"


def label(backend: str, device_type: str) -> str:
    """The compiled path (or the CUDA-graph path, captured.py) in words, for the fingerprint and the report."""
    from nondet.probes.core import captured

    if backend == captured.BACKEND:
        return captured.LABEL
    graphs = ", CUDA graphs" if cuda_graphs(device_type) else ""
    return f"torch.compile ({backend}{graphs}), static KV cache"


@dataclass
class ModePath:
    """One kernels mode's decode path and where its time went (seconds)."""

    path: str = COMPILED  # compiled, cuda-graphs (captured.BACKEND) or eager (a failed first warm-up)
    reason: str | None = None  # why a mode fell back to eager
    warmup_s: float = 0.0  # compile + CUDA-graph capture + warm-up calls
    measured_s: float = 0.0  # the conditions' own generate calls
    conditions: int = 0
    warm_ups: int = 0  # one per batch shape: conditions of a shape already warmed up reuse its graphs
    # dynamo's graph breaks while warming up: each leaves a piece of the step eager (and out of the CUDA
    # graph), e.g. transformers 5.17's tensor-parallel modules; 0 = one graph per shape
    graph_breaks: int = 0
    # graphs dynamo traced while warming up (each one compile): with the batch symbolic from the first trace
    # (precompiled.py, dynamic_jit.py) one serves every batch size, 0 where the saved ones were loaded
    graphs_traced: int = 0


def _precompiled_log_position() -> int:
    """Where this run's entries begin in the saved steps' log (core/precompiled.py)."""
    from nondet.probes.core.precompiled import log_position

    return log_position()


def _recorded_counts() -> dict:
    """The CUDA-graph path's counts so far in this process (captured.py)."""
    from nondet.probes.core import captured

    return captured.counts()


@dataclass
class DecodePaths:
    """The compiled path's bookkeeping across a probe: which path each kernels mode took, and time."""

    backend: str
    device_type: str
    modes: dict[str, ModePath] = field(default_factory=dict)
    precompiled_since: int = field(default_factory=_precompiled_log_position)  # this run's saved steps
    recorded_before: dict = field(default_factory=_recorded_counts)  # the CUDA-graph path's counts at the start

    def compiles(self, mode: str) -> bool:
        """Whether the mode's conditions still run compiled, or recorded in CUDA graphs (True until a first
        warm-up fails)."""
        return self._entry(mode).path != EAGER

    def _entry(self, mode: str) -> ModePath:
        """The mode's bookkeeping; a new one starts on this path: compiled, or the CUDA-graph path's name."""
        from nondet.probes.core import captured

        name = captured.BACKEND if self.backend == captured.BACKEND else COMPILED
        return self.modes.setdefault(mode, ModePath(path=name))

    def warm_up(self, mode: str, warm) -> None:
        """Run `warm()` (a short generate of the condition's shape), timed as warm-up. A failure at the
        mode's first condition switches the mode to eager; a later one is an error."""
        entry = self._entry(mode)
        started, breaks, graphs = time.perf_counter(), _graph_breaks(), _graphs_traced()
        entry.warm_ups += 1
        try:
            warm()
        except NondetError:
            raise
        except Exception as exc:  # noqa: BLE001 - dynamo / Inductor / CUDA-graph failures have no common base
            if entry.conditions:
                flag, did = ("--compile", "compiled") if entry.path == COMPILED else ("--cuda-graphs", "recorded")
                raise NondetError(f"{flag}: {mode} kernels {did} their first condition but failed on a later one "
                                  f"({_first_line(exc)}); rerun without {flag}") from exc
            entry.path, entry.reason = EAGER, _first_line(exc)
            debug_traceback(exc)
        finally:
            entry.warmup_s += time.perf_counter() - started
            entry.graph_breaks += _graph_breaks() - breaks
            entry.graphs_traced += _graphs_traced() - graphs

    def measured(self, mode: str, seconds: float) -> None:
        entry = self._entry(mode)
        entry.measured_s += seconds
        entry.conditions += 1

    def as_summary(self) -> dict:
        """summary.json "decode_path": the compiled label and, per kernels mode, its path and time, and
        which decode steps were loaded from saved functions (core/precompiled.py)."""
        from nondet.probes.core.precompiled import report

        return {"compiled": label(self.backend, self.device_type), "backend": self.backend,
                "precompiled": report(self.precompiled_since),
                "modes": {m: {"path": e.path, "reason": e.reason, "warmup_s": round(e.warmup_s, 3),
                              "measured_s": round(e.measured_s, 3), "conditions": e.conditions,
                              "warm_ups": e.warm_ups, "graph_breaks": e.graph_breaks,
                              "graphs_traced": e.graphs_traced, **self._recorded(m)}
                          for m, e in self.modes.items()}}

    def _recorded(self, mode: str) -> dict:
        """On the CUDA-graph path, the mode's steps run eagerly, graphs recorded and steps replayed in this run
        (what shows the graphs really ran); {} on the compiled path."""
        from nondet.probes.core import captured

        if self.backend != captured.BACKEND:
            return {}
        now, before = captured.counts().get(mode, {}), self.recorded_before.get(mode, {})
        return {what: now.get(what, 0) - before.get(what, 0) for what in ("eager_steps", "graphs_recorded",
                                                                         "steps_replayed")}


def _graph_breaks() -> int:
    """Graph breaks dynamo has counted in this process so far (each one counted as it is traced)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _graphs_traced() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"
