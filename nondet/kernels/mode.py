"""The batch-invariant mode: a context manager that nests and switches op classes one at a time.

    with batch_invariant(model=model):                 # all classes, attention selected on model
        with batch_invariant(ops={"matmul"}):          # ablation: only matmul is invariant here
            ...
        # back to all classes, exactly

Inside a context the active op classes are exactly its `ops` (None = all of OP_CLASSES); on
exit the enclosing context's set is restored, also when the body raises. aten overrides live
in one torch.library.Library that is rebuilt on every change (destroying a Library removes
its kernels, so the previous kernels come back); the attention class is the transformers
attention interface (hf.py); the experts class is transformers' ExpertsInterface (experts.py:
every MoE experts module of the model points at the invariant experts for the body); the router
class overrides aten::topk (ties by lowest index) and runs each router module's forward with the
invariant matmul and softmax, even when those classes are off (router.py), so `ops={"router"}`
alone makes exactly the routing decisions invariant. On a dense model experts and router change
nothing. Under tensor parallelism the row-parallel all-reduce finishes a
matmul's K sum across ranks, so the matmul class also makes it invariant (collective.py);
"collective" alone switches only that (an ablation). Importing this module changes nothing.
"""

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from nondet.kernels import collective, experts, hf, overrides, router

OP_CLASSES = ("matmul", "norm", "attention", "softmax", "experts", "router", "elementwise")
EXTRA_CLASSES = ("collective",)  # accepted in ops; on with "matmul" (None = all includes it that way)


@dataclass
class _Frame:
    ops: frozenset  # op classes active inside this context
    model: object = None  # the model whose attention implementation this context selected
    previous_impl: str | None = None  # what to put back on the model at exit
    previous_experts: str | None = None  # the experts implementation to put back at exit
    routers: list = field(default_factory=list)  # router modules whose forward this context wrapped


_STACK: list[_Frame] = []
_LIBRARY = None  # the torch.library.Library holding the active aten overrides, or None


def active_ops() -> frozenset:
    """The op classes made batch-invariant right now (empty outside any context)."""
    return _STACK[-1].ops if _STACK else frozenset()


def is_active(op_class: str | None = None) -> bool:
    """Whether the mode is on (for one op class, when given)."""
    return bool(active_ops()) if op_class is None else op_class in active_ops()


def _parse(ops: Iterable[str] | str | None) -> frozenset:
    if ops is None:
        return frozenset(OP_CLASSES)
    wanted = frozenset([ops] if isinstance(ops, str) else ops)
    known = OP_CLASSES + EXTRA_CLASSES
    unknown = sorted(wanted - set(known))
    if unknown:
        raise ValueError(f"unknown op class {', '.join(unknown)}; choose from {', '.join(known)}")
    return wanted


def _install(ops: frozenset) -> None:
    """Make the aten overrides exactly those of `ops` (rebuilding the one Library), and tell the
    attention function (hf.py) whether its class is on."""
    global _LIBRARY
    hf.set_enabled("attention" in ops)
    matmul_scope = None if "matmul" in ops else (lambda: batch_invariant(ops=ops | {"matmul"}))
    experts.set_enabled("experts" in ops, matmul_scope)
    collective.set_enabled("matmul" in ops or "collective" in ops)
    if _LIBRARY is not None:
        _LIBRARY._destroy()
        _LIBRARY = None
    entries = [entry for cls in OP_CLASSES if cls in ops for entry in overrides.OP_TABLE[cls]]
    if not entries:
        return
    import torch

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # torch warns once that an existing kernel is overridden: that is the point here.
        warnings.simplefilter("ignore", UserWarning)
        for name, kernel in entries:
            if overrides.available(name):
                for key in overrides.KEY_OF.get(name, overrides.DISPATCH_KEYS):
                    library.impl(name, kernel, key)
    _LIBRARY = library


@contextlib.contextmanager
def batch_invariant(ops: Iterable[str] | str | None = None, model=None,
                    traceable: bool | str = False, allow_uncovered: bool = False,
                    _census: bool = True) -> Iterator[None]:
    """Run the body with batch-invariant kernels for the op classes `ops` (None = all).

    ops: a subset of OP_CLASSES ("matmul", "norm", "attention", "softmax", "experts", "router").
    model: a transformers model; its attention implementation ("attention") and experts
    implementation ("experts") are switched to the invariant ones for the body, its routers
    wrapped ("router"), and all of it restored afterwards. A model with a module the mode cannot
    make invariant raises coverage.UnsupportedModel (one line naming the module) before anything
    is switched: its structure is checked, then its op census is taken (census.py: one short
    forward, cached per model class and config) and every reduction the mode does not route
    refuses, unless `allow_uncovered` (the run is then partly invariant: coverage.verify).
    traceable: also route the model's torch functions to nondet:: custom ops (traced.py), so a
    torch.compile'd forward called in the body keeps the mode's reductions opaque (same bits as
    eager). Off by default: in eager the aten overrides do the work without the per-call cost.
    """
    if traceable not in (False, True, "compiled_calls"):
        raise ValueError(f"traceable must be False, True or 'compiled_calls', not {traceable!r}")
    frame = _Frame(_parse(ops), model)
    if model is not None:
        from nondet.kernels import coverage

        if _census:
            verify_coverage(model, compiled=bool(traceable), allow_uncovered=allow_uncovered)
        else:
            coverage.check(model)
    _STACK.append(frame)
    traced = None
    try:
        _install(frame.ops)
        _reserve_counters()
        if model is not None:
            _select_on_model(frame)
        if traceable:
            from nondet.kernels.traced import traced_scope

            traced = traced_scope(frame.ops, compiled_calls_only=traceable == "compiled_calls")
            traced.__enter__()
        yield
    finally:
        if traced is not None:
            traced.__exit__(None, None, None)
        _STACK.pop()
        try:
            _restore_model(frame)
        finally:
            _install(active_ops())


def census_of(model, compiled: bool = False):
    """The model's op census (kernels/census.py), cached; refuses nothing."""
    from nondet.kernels import census

    return census.take(model, _census_scope(model, compiled), compiled)


def verify_coverage(model, compiled: bool = False, allow_uncovered: bool = False, saved=None):
    """The model's op census after the mode's refusals (coverage.verify): UnsupportedModel, one line.
    saved: a store of the census between processes (census.take), or None."""
    from nondet.kernels import coverage

    return coverage.verify(model, _census_scope(model, compiled), compiled, allow_uncovered, saved)


def _census_scope(model, compiled: bool):
    return lambda: batch_invariant(model=model, traceable=compiled, _census=False)


def _reserve_counters() -> None:
    """The split launches' counter buffer on the current CUDA device, made here on the default stream
    so that a compiled step whose first split launch is captured into a CUDA graph finds it
    (counters.py). Never initialises CUDA itself."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        from nondet.kernels import counters

        counters.reserve(torch.device("cuda", torch.cuda.current_device()))


def _select_on_model(frame: _Frame) -> None:
    """Point the model's attention and experts at the invariant implementations; wrap its routers."""
    model = frame.model
    if "attention" in frame.ops:
        hf.register()
        previous = model.config._attn_implementation
        if previous != hf.ATTN_IMPLEMENTATION:
            hf.select(model, hf.ATTN_IMPLEMENTATION)
            frame.previous_impl = previous
    if "experts" in frame.ops and experts.experts_modules(model):
        experts.register()
        previous = experts.experts_modules(model)[0].config._experts_implementation
        if previous != experts.EXPERTS_IMPLEMENTATION:
            experts.select(model, experts.EXPERTS_IMPLEMENTATION)
            frame.previous_experts = previous
    if "router" in frame.ops:
        frame.routers = router.wrap(model, router.router_scope(active_ops, batch_invariant))


def _restore_model(frame: _Frame) -> None:
    try:
        if frame.previous_impl is not None:
            hf.select(frame.model, frame.previous_impl)
    finally:
        router.unwrap(frame.routers)
        if frame.previous_experts is not None:
            experts.select(frame.model, frame.previous_experts)
