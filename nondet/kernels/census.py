"""The op census: what the mode reaches on one model, found by running it, not assumed from a list.

One short forward (PROMPT tokens of prefill at ROWS rows, then one decode step against the KV cache)
runs under the whole mode inside a TorchDispatchMode that sees every aten op the model calls, with
the module that called it. Each op is one of:

- routed: computed by the mode's kernel (an aten override that takes the call, see
  overrides.TAKES; a nondet:: custom op; or any op run inside one of our kernels, as the CPU
  attention's own slices and matmuls);
- row-independent: on op_kinds' reviewed allowlist (views, elementwise, indexing, exact reductions);
- uncovered: any other reduction or contraction, or an op nobody reviewed. Its row may depend on
  the batch while the mode claims otherwise, so coverage.check refuses the model.

With `compiled=True` (the traced mode under torch.compile) only nondet:: ops count as routed: an
aten reduction in the trace is compiled by Inductor in an order of its choosing.

The same forward also runs with default kernels: the mode's logits must equal them within rounding
(TOLERANCE, relative to the largest default logit). A mode that changes what the model computes
beyond that is wrong, not invariant.

The result is cached per (model class, config, dtype, device, compiled, instruction set): a probe
enters the mode many times on one model. A caller that can name the model's files may also pass a
store (`saved`: read() -> Census or None, write(Census)) that keeps the census between processes
(probes/core/saved_census.py); the census then says where it was taken (`taken`).
"""

import contextlib
import hashlib
import inspect
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nondet.kernels import op_kinds, overrides

ROUTED, ROW_INDEPENDENT, UNCOVERED = "routed", "row-independent", "uncovered"
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d")
# collectives that move data without arithmetic (a gathered lm_head's logits, DTensor's bookkeeping)
_COPYING_COLLECTIVES = {"all_gather_into_tensor", "all_gather_into_tensor_out", "allgather_", "broadcast",
                        "broadcast_", "wait_tensor", "_wrap_tensor_autograd", "all_to_all_single", "alltoall_base_"}
TAKEN_HERE = "in this process"
ROWS, PROMPT = 2, 5  # a short forward that still has a batch (rows) and a prefill longer than a decode
# largest |mode - default| logit allowed, relative to the largest |default logit|: rounding through
# the layers (an 8B-shaped random bf16 Qwen3 of 36 layers on an H200: 0.25 of 3.4, so 0.07), far below
# what a wrong kernel (a lost mask, a wrong scale) changes, which moves logits by their own size
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 1e-1, torch.float16: 2e-2}

_KERNEL_DIR = os.path.dirname(os.path.abspath(__file__))
# files of nondet.kernels whose functions run model code or hand a call back to the original kernel;
# every other file there computes only inside the mode's kernels
_PASS_THROUGH_FILES = {"census.py", "mode.py", "hf.py", "router.py", "variant.py", "traced.py", "coverage.py"}
_PASS_THROUGH_FUNCTIONS = {"experts_forward", "previous_forward"}  # experts.py: the class switched off


@dataclass(frozen=True)
class OpUse:
    """One (module, aten op) pair of the forward and how the mode meets it."""

    module: str  # the innermost module that ran it ('' for the model's own forward)
    op: str  # 'aten::cumsum', 'nondet::mm'
    verdict: str  # ROUTED / ROW_INDEPENDENT / UNCOVERED
    why: str  # 'elementwise', 'our attention kernel', 'no invariant kernel', ...
    calls: int


@dataclass(frozen=True)
class Census:
    model_class: str
    dtype: str
    compiled: bool
    uses: tuple[OpUse, ...]
    max_logit_diff: float  # largest |mode - default| logit over both forwards
    tolerance: float  # the allowed largest difference (TOLERANCE x largest |default logit|)
    skipped: tuple[str, ...] = field(default=())  # checks not made, with why
    taken: str = TAKEN_HERE  # where the forwards ran: this process, or the stored census's record

    def uncovered(self) -> list[OpUse]:
        return [use for use in self.uses if use.verdict == UNCOVERED]

    def counts(self) -> dict[str, int]:
        """Calls per verdict."""
        totals = Counter({ROUTED: 0, ROW_INDEPENDENT: 0, UNCOVERED: 0})
        for use in self.uses:
            totals[use.verdict] += use.calls
        return dict(totals)

    def agrees(self) -> bool:
        return self.max_logit_diff <= self.tolerance

    def to_json(self) -> dict:
        """What fingerprint.json and the report keep."""
        return {"model_class": self.model_class, "dtype": self.dtype, "compiled": self.compiled,
                "counts": self.counts(), "max_logit_diff": self.max_logit_diff, "tolerance": self.tolerance,
                "uncovered": [f"{use.module or self.model_class}: {use.op}" for use in self.uncovered()],
                "skipped": list(self.skipped), "taken": self.taken}

    def to_record(self) -> dict:
        """Everything, for a store (from_record reads it back)."""
        return {"model_class": self.model_class, "dtype": self.dtype, "compiled": self.compiled,
                "uses": [[u.module, u.op, u.verdict, u.why, u.calls] for u in self.uses],
                "max_logit_diff": self.max_logit_diff, "tolerance": self.tolerance, "skipped": list(self.skipped)}


def from_record(record: dict, taken: str) -> Census:
    """A Census from to_record's dict (KeyError / TypeError / ValueError where it is not one)."""
    uses = tuple(OpUse(str(m), str(op), str(v), str(why), int(n)) for m, op, v, why, n in record["uses"])
    if any(u.verdict not in (ROUTED, ROW_INDEPENDENT, UNCOVERED) for u in uses):
        raise ValueError("unknown verdict")
    return Census(model_class=str(record["model_class"]), dtype=str(record["dtype"]), compiled=bool(record["compiled"]),
                  uses=uses, max_logit_diff=float(record["max_logit_diff"]), tolerance=float(record["tolerance"]),
                  skipped=tuple(str(s) for s in record["skipped"]), taken=taken)


_CACHE: dict[tuple, Census] = {}


def take(model, mode_scope, compiled: bool = False, saved=None) -> Census:
    """The census of `model` (cached per class, config, dtype, device, compiled, instruction set, ranks).
    mode_scope(): a context manager of the whole mode on `model` (mode.census_of passes it), without a
    census of its own. saved: a store of this model's census between processes, or None (the module doc)."""
    key = cache_key(model, compiled)
    if key not in _CACHE:
        found = saved.read() if saved is not None else None
        if found is None:
            found = _run(model, mode_scope, compiled)
            if saved is not None:
                saved.write(found)
        _CACHE[key] = found
    return _CACHE[key]


def cache_key(model, compiled: bool) -> tuple:
    config = model.config.to_json_string() if hasattr(model, "config") else repr(model)
    parameter = next(model.parameters(), None)
    where = (str(parameter.dtype), str(parameter.device)) if parameter is not None else ("", "")
    digest = hashlib.sha256(config.encode()).hexdigest()[:16]
    return type(model).__qualname__, digest, where, compiled, torch.backends.cpu.get_cpu_capability(), _world()


def _world() -> int:
    """Ranks of the default process group: a model sharded by tensor parallelism runs other ops (its
    collectives) than the same config whole."""
    distributed = torch.distributed
    return distributed.get_world_size() if distributed.is_available() and distributed.is_initialized() else 1


def _run(model, mode_scope, compiled: bool) -> Census:
    ids, mask = _inputs(model)
    with torch.no_grad(), _quiet_transformers():
        default = _forward_row_by_row(model, ids, mask)
        recorder = _Recorder(model, compiled)
        with mode_scope(), recorder:
            ours = _forward(model, ids, mask)
    return Census(model_class=type(model).__name__, dtype=str(_model_dtype(model)).replace("torch.", ""),
                  compiled=compiled, uses=recorder.uses(), max_logit_diff=_largest_diff(default, ours),
                  tolerance=_tolerance(model, default))


def _model_dtype(model) -> torch.dtype:
    parameter = next(model.parameters(), None)
    return parameter.dtype if parameter is not None else torch.float32


def _inputs(model) -> tuple[torch.Tensor, torch.Tensor]:
    """ROWS x PROMPT token ids (different per row, no special low ids) on the model's device."""
    vocab = model.get_input_embeddings().num_embeddings
    parameter = next(model.parameters())
    ids = (torch.arange(ROWS * PROMPT).reshape(ROWS, PROMPT) * 7 + 3) % max(vocab - 3, 1) + 3
    return ids.to(parameter.device), torch.ones_like(ids, device=parameter.device)


def _forward(model, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Prefill logits of the last position and one decode step's logits, (ROWS, V) each, in fp32.
    The decode step feeds token ids[:, 0] (not the argmax, which may differ between the two forwards
    at a near tie and would make their decode logits incomparable)."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    step = ids[:, :1]
    mask = torch.cat([mask, torch.ones_like(step)], dim=1)
    nxt = model(input_ids=step, attention_mask=mask, use_cache=True, **cache_argument(model, out))
    return [out.logits[:, -1].float(), nxt.logits[:, -1].float()]


def _forward_row_by_row(model, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """_forward with each row alone: the default kernels' answer for a lone request. (A module built
    batch-variant on purpose, the demo's injected norm, computes its own formula there: one_row.py.)"""
    from nondet.kernels.one_row import one_row_paths

    with one_row_paths():
        rows = [_forward(model, ids[r:r + 1], mask[r:r + 1]) for r in range(ids.shape[0])]
    return [torch.cat(parts) for parts in zip(*rows)]


def cache_argument(model, out) -> dict:
    """The prefill's KV cache as the next call takes it: `cache` from transformers 5.2x on (it
    deprecates `past_key_values`), `past_key_values` before."""
    cache = out["cache"] if "cache" in out else out.get("past_key_values")
    if cache is None:
        return {}
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def _largest_diff(default: list[torch.Tensor], ours: list[torch.Tensor]) -> float:
    """Largest |default - mode| logit; equal entries count 0 (two -inf of a masked vocabulary entry are equal, their
    difference NaN). NaN only where a forward's own logits are NaN (coverage.verify names that)."""
    return max(float(torch.where(a == b, 0.0, (a.float() - b.float()).abs()).max()) for a, b in zip(default, ours))


def _tolerance(model, default: list[torch.Tensor]) -> float:
    scale = max(float(t.abs().max()) for t in default)
    return TOLERANCE.get(_model_dtype(model), 1e-2) * max(scale, 1.0)


class _Recorder(TorchDispatchMode):
    """Every aten op of the forward, with the innermost module running and the verdict."""

    def __init__(self, model, compiled: bool):
        super().__init__()
        self._compiled = compiled
        self._names = {module: name for name, module in model.named_modules()}
        self._stack: list[torch.nn.Module] = []  # the modules running, innermost last
        self._hooks: list = []
        self._counts: Counter = Counter()

    def __enter__(self):
        for module in self._names:
            self._hooks.append(module.register_forward_pre_hook(self._push))
            self._hooks.append(module.register_forward_hook(self._pop, always_call=True))
        try:
            return super().__enter__()
        except BaseException:
            self._remove_hooks()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _push(self, module, args):
        self._stack.append(module)

    def _pop(self, module, args, output):
        if self._stack:
            self._stack.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _runs_as_its_decomposition(func):
            # Under torch.inference_mode a composite op (aten::linear) reaches this mode whole: autograd,
            # which decomposes it otherwise, is off. The backend then runs the same decomposition
            # (linear -> addmm / mm, the ops the mode overrides), so it is recorded op by op, as it runs.
            TorchDispatchMode.__enter__(self)  # the mode again for the parts; not our __enter__ (its hooks)
            try:
                out = func.decompose(*args, **kwargs)
            finally:
                TorchDispatchMode.__exit__(self, None, None, None)
            if out is not NotImplemented:
                return out
        module = self._stack[-1] if self._stack else None
        verdict, why = classify(func, args, kwargs, self._compiled, _inside_our_kernel(), module)
        self._counts[(self._names[module] if module is not None else "", _op_name(func), verdict, why)] += 1
        return func(*args, **kwargs)

    def uses(self) -> tuple[OpUse, ...]:
        return tuple(OpUse(module, op, verdict, why, calls)
                     for (module, op, verdict, why), calls in self._counts.items())


def _runs_as_its_decomposition(func) -> bool:
    """Whether the backends run the op as its CompositeImplicitAutograd decomposition (no kernel of
    their own on the CPU or CUDA key): aten::linear, matmul, softmax.int, layer_norm, sdpa."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = func.name()
    return has(name, "CompositeImplicitAutograd") and not has(name, "CPU") and not has(name, "CUDA")


def classify(func, args, kwargs, compiled: bool, in_kernel: bool, module=None) -> tuple[str, str]:
    """(verdict, why) of one aten call under the whole mode; module: the innermost module running."""
    namespace = func.namespace
    if namespace == "nondet":
        return ROUTED, "nondet custom op"
    if in_kernel:
        return ROUTED, "inside a nondet kernel"
    if namespace in COLLECTIVE_NAMESPACES:
        return collective_kind(op_kinds.base_name(func), module)
    name = _override_name(func)
    taken = name is not None and overrides.TAKES[name](*args, **kwargs)
    if taken and not compiled:
        return ROUTED, f"aten override ({overrides.op_class_of(name)})"
    kind = op_kinds.row_independent(func, args, kwargs)
    if kind is not None:
        return ROW_INDEPENDENT, kind
    if taken:
        return UNCOVERED, "an aten override, which a compiled graph does not call"
    if name is not None:
        return UNCOVERED, "handed back to the original kernel (dim, dtype or shape not covered)"
    return UNCOVERED, "no batch-invariant kernel"


def collective_kind(name: str, module) -> tuple[str, str]:
    """A collective the mode's all-reduce (collective.py, which takes torch.distributed.all_reduce, the
    call of transformers' row-parallel linears) did not take: a copy is row-independent; a sum in a
    vocab-parallel embedding adds each element's one lookup to exact zeros (the other ranks mask ids
    outside their shard), so its order cannot change a bit; any other sum has the backend's order.
    module: the innermost module running, or its class (a compiled graph keeps the class)."""
    if name in _COPYING_COLLECTIVES:
        return ROW_INDEPENDENT, "a collective that copies (no arithmetic)"
    if isinstance(module, torch.nn.Embedding) or (isinstance(module, type) and issubclass(module, torch.nn.Embedding)):
        return ROW_INDEPENDENT, "a vocab-parallel embedding's sum: one rank's lookup plus exact zeros"
    return UNCOVERED, "a collective sum outside the mode's all-reduce (the backend's summation order)"


def _override_name(func) -> str | None:
    """The key of overrides.TAKES for this overload ('mean.dim', 'mm'), or None."""
    base = op_kinds.base_name(func)
    overload = func._overloadname
    for name in (f"{base}.{overload}", base if overload == "default" else None):
        if name in overrides.TAKES:
            return name
    return None


def _op_name(func) -> str:
    return f"{func.namespace}::{op_kinds.base_name(func)}"


def _inside_our_kernel() -> bool:
    """Whether a frame of nondet.kernels' own arithmetic is on the Python stack (its inner ops are ours)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        directory, filename = os.path.split(code.co_filename)
        if (directory == _KERNEL_DIR and filename not in _PASS_THROUGH_FILES
                and code.co_name not in _PASS_THROUGH_FUNCTIONS):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' warnings of the census's own forwards (a kernel fallback, a deprecated argument) are
    not the user's: the model's real run prints them where they belong."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


@contextlib.contextmanager
def cleared():
    """Forget every cached census for the body (tests)."""
    saved = dict(_CACHE)
    _CACHE.clear()
    try:
        yield
    finally:
        _CACHE.clear()
        _CACHE.update(saved)
