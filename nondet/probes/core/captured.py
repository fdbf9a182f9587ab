"""Eager kernels replayed from CUDA graphs (`probe --cuda-graphs`): each decode step recorded once per signature.

SGLang serves by default with the model's own eager kernels recorded in CUDA graphs, one per batch size (vLLM's
eager-model runners did the same): no compiler, so nothing is traced, and the numbers are those of the eager
kernels on a static KV cache (`--kv-cache static`), since a graph replays the very launches it recorded.
transformers' generate calls `model._compiled_call(**inputs)` for each decode step when its cache is static and a
compile config is set (`get_compiled_call`); `install` puts a CapturedSteps there. The prefill stays eager, as
transformers runs it.

The first call of a signature runs eagerly (Triton compiles our kernels, lazy buffers are made, cuBLAS picks its
kernels); the second records the step into a graph that reads input buffers of its own, then replays it; later
calls copy their tensors into those buffers and replay. Recording runs nothing, so the cache's own state
(transformers 5.24 keeps each layer's length on the device and advances it inside the step) moves once a step.

A graph serves the calls of one signature (graph_signature.py): what its recorded launches depend on, among
them the cache's addresses and the kernels in force, so a graph recorded under the default kernels never replays
under the mode. A step that changes plain Python state of its cache is not recorded (HostStateStep). The graphs
share one memory pool, as vLLM's do: a step's intermediates are dead once it returns, one graph replays at a
time, and each graph's outputs stay allocated while the graph is held.
"""

from dataclasses import dataclass

import torch

from nondet.probes.core.decoding_mode import current
from nondet.probes.core.graph_signature import host_values, signature

BACKEND = "cuda-graphs"  # DecodePaths' backend name for this path (compiled.py labels it with LABEL)
LABEL = "eager kernels replayed from CUDA graphs (one per batch shape), static KV cache"
# per kernels mode (decoding_mode.current()), in this process: decode steps run eagerly (a signature's first), graphs recorded, steps
# replayed; a run's summary reports what changed while it ran (compiled.DecodePaths)
_COUNTS: dict[str, dict[str, int]] = {}
# A replayed graph runs no Python, so a forward hook sees only the eager step and the recording. A hook that needs
# every step's values (routing_trace.py) hands the tensor it computed to keep() while a step is recorded: the graph
# then rewrites that tensor at each replay, and the listeners (listen()) get the step's kept tensors after it
_KEEPING: list[list] = []  # the kept tensors of the recording under way (one list while _record runs)
_LISTENERS: list = []


def keep(tensor) -> bool:
    """While a step is being recorded: keep `tensor` (computed by the step) for the listeners after every replay,
    and True; else False (the caller reads the tensor itself, now)."""
    if not _KEEPING:
        return False
    _KEEPING[-1].append(tensor)
    return True


def listen(callback) -> None:
    """callback(kept tensors) after every replay from now on (the tensors in the order keep() got them), until
    unlisten(callback)."""
    _LISTENERS.append(callback)


def unlisten(callback) -> None:
    _LISTENERS.remove(callback)


def counts() -> dict[str, dict[str, int]]:
    """A copy of the counts so far: {mode: {"eager_steps", "graphs_recorded", "steps_replayed": n}}."""
    return {mode: dict(c) for mode, c in _COUNTS.items()}


def _count(what: str) -> None:
    tally = _COUNTS.setdefault(current(), {})
    tally[what] = tally.get(what, 0) + 1


def generation_fields() -> dict:
    """GenerationConfig fields that make generate call `_compiled_call` for its decode steps: a static cache
    and a compile config (transformers reads it only to decide; nothing here is compiled)."""
    from transformers import CompileConfig

    return {"cache_implementation": "static", "compile_config": CompileConfig()}


def install(model, compile_config) -> "CapturedSteps":
    """transformers' compiled call for this generate: the model's CapturedSteps (kept on the model, so the
    graphs recorded by one call replay in the next)."""
    steps = getattr(model, "_compiled_call", None)
    if not isinstance(steps, CapturedSteps):
        steps = CapturedSteps(model)
    model._compiled_call, model._last_compile_config = steps, compile_config
    return steps


def uninstall(model) -> None:
    """Take the CapturedSteps off the model (a compiled generate must not meet recorded graphs)."""
    if isinstance(getattr(model, "_compiled_call", None), CapturedSteps):
        del model._compiled_call


@dataclass
class Recorded:
    """One signature's graph, the input buffers it reads and the step output it rewrites at each replay."""

    graph: "torch.cuda.CUDAGraph"
    buffers: dict  # input slot (name, or (name, key) inside a dict) -> the tensor the graph reads
    output: object  # the model's output at recording: its logits are the graph's, rewritten by every replay
    kept: list  # tensors hooks kept (keep()), rewritten by every replay and handed to the listeners


class CapturedSteps:
    """transformers' `_compiled_call` on the CUDA-graph path: eager once, then recorded and replayed."""

    def __init__(self, model) -> None:
        self.model = model
        self.seen: set = set()  # signatures that ran once eagerly
        self.recorded: dict[tuple, Recorded] = {}
        self.pool = None  # one memory pool for every graph, made at the first recording

    def __call__(self, **inputs):
        key = signature(inputs)
        if key not in self.recorded and key not in self.seen:
            self.seen.add(key)
            _count("eager_steps")
            return _eager_step(self.model, inputs)
        if key not in self.recorded:
            self.recorded[key] = self._record(inputs)
            _count("graphs_recorded")
        return self._replay(self.recorded[key], inputs)

    def _record(self, inputs: dict) -> Recorded:
        buffers = {slot: t.clone() for slot, t in tensor_slots(inputs)}  # outside the graph's pool
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
        _KEEPING.append([])
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                output = self.model(**fed_from(inputs, buffers))
        finally:
            kept = _KEEPING.pop()
        return Recorded(graph, buffers, output, kept)

    def _replay(self, recorded: Recorded, inputs: dict):
        for slot, tensor in tensor_slots(inputs):
            recorded.buffers[slot].copy_(tensor)
        recorded.graph.replay()
        _count("steps_replayed")
        for listener in _LISTENERS:
            listener(recorded.kept)
        return recorded.output


class HostStateStep(RuntimeError):
    """A decode step that changes Python state of its arguments (e.g. transformers' sliding-window cache counts
    its length in an int): a replayed graph would not change it, so the step is not recorded."""


def _eager_step(model, inputs: dict):
    """A signature's first step, eagerly; HostStateStep where it changed a plain attribute of an argument."""
    before = host_values(inputs)
    output = model(**inputs)
    changed = sorted(set(host_values(inputs)) - set(before))
    if changed:
        *path, value = changed[0]
        where = ".".join(part for part in path if part)
        raise HostStateStep(f"the decode step changes {where} (now {value!r}) on the host, which a replayed CUDA "
                            "graph would not")
    return output


def tensor_slots(inputs: dict):
    """(slot, tensor) for each tensor argument: top-level ones by name, those in a dict (transformers' masks
    per layer type) by (name, key)."""
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, dict):
            for key, inner in value.items():
                if isinstance(inner, torch.Tensor):
                    yield (name, key), inner


def fed_from(inputs: dict, buffers: dict) -> dict:
    """The inputs with each tensor replaced by its buffer."""
    fed = {}
    for name, value in inputs.items():
        if isinstance(value, dict):
            fed[name] = {key: buffers.get((name, key), inner) for key, inner in value.items()}
        else:
            fed[name] = buffers.get(name, value)
    return fed
