"""The op census of what Inductor actually compiled under the mode: every graph, after tracing.

census.py takes the compiled path's census by running the traced mode eagerly (compiled=True counts
only nondet:: ops as routed). A compiled forward can still hold ops that run never showed: code under
`torch.compiler.is_compiling()`, Inductor's own decompositions. So while the traced mode is active,
Inductor runs this pass on every post-grad graph (aten level, after decomposition, before its own
code generation) and sorts each call like the census does:

- routed: a nondet:: op, or a Triton kernel of nondet.kernels (a triton_op's launch, which Inductor
  sees through as a kernel wrapper);
- row-independent: op_kinds' reviewed allowlist, and prims' casts, iotas and views;
- uncovered: a float reduction or contraction (sum, mean, matmul, convolution, cumsum, softmax, a
  norm, attention, an accumulating scatter) that is not ours: Inductor compiles it in an order of
  its choosing, which may follow the batch;
- unreviewed: anything else; listed, not refused (a compiled graph holds ops the eager census never
  meets, such as the functional forms of in-place copies).

A graph loaded from Inductor's cache is not traced again, so while a census collects the pass turns
the cache off (its uuid is None). `inspected` counts the graphs it saw, and a result over zero graphs
(another backend, aot_eager, runs no Inductor pass) says so rather than claiming coverage.
"""

import collections
import contextlib
import hashlib
from dataclasses import dataclass, field

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from nondet.kernels import op_kinds, symmetric_sum
from nondet.kernels.census import COLLECTIVE_NAMESPACES, ROW_INDEPENDENT, collective_kind

# float reductions and contractions: their order of accumulation is the compiler's choice
REDUCING = frozenset("""
    sum mean prod var var_mean std std_mean mm bmm addmm baddbmm addmv mv dot matmul convolution
    _convolution cumsum cumprod logcumsumexp _softmax _log_softmax softmax log_softmax norm
    linalg_vector_norm native_layer_norm native_group_norm native_batch_norm _fused_rms_norm rms_norm
    _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
    _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_cudnn_attention
    scaled_dot_product_attention index_add scatter_add scatter_reduce logsumexp einsum _weight_int4pack_mm
    """.split())
# prims that only cast, make or reshape values
_PRIMS_ROW_INDEPENDENT = frozenset("convert_element_type iota view_of broadcast_in_dim squeeze device_put".split())
_KERNEL_WRAPPERS = ("triton_kernel_wrapper_functional", "triton_kernel_wrapper_mutation")
_COLLECTING: list["GraphCensus"] = []  # what the pass reports to (collecting); none: it sorts nothing


@dataclass
class GraphCensus:
    """What the pass found over the graphs Inductor compiled under the mode."""

    inspected: int = 0
    routed: int = 0
    row_independent: int = 0
    uncovered: collections.Counter = field(default_factory=collections.Counter)  # (module, op) -> calls
    unreviewed: collections.Counter = field(default_factory=collections.Counter)  # op -> calls
    store: object = None  # census_store.CensusStore: each graph's findings kept beside Inductor's cache
    stored: int = 0  # graphs whose findings came from the store (compiled under it before; see census_store.py)
    store_read: bool = False  # the store's findings are added once, when the census first collects

    @classmethod
    def from_json(cls, doc: dict) -> "GraphCensus":
        """The census to_json wrote (the findings; not the store)."""
        return cls(doc["graphs_inspected"], doc["routed"], doc["row_independent"],
                   collections.Counter({(u["module"], u["op"]): u["calls"] for u in doc["uncovered"]}),
                   collections.Counter(doc["unreviewed"]), stored=doc.get("graphs_from_store", 0))

    def add(self, other: "GraphCensus") -> None:
        self.inspected += other.inspected
        self.stored += other.stored
        self.routed += other.routed
        self.row_independent += other.row_independent
        self.uncovered.update(other.uncovered)
        self.unreviewed.update(other.unreviewed)

    def add_stored(self, entry: dict) -> None:
        """A graph's findings from the store (an entry of to_json's form), counted apart from `inspected`."""
        found = GraphCensus.from_json(entry)
        found.inspected, found.stored = 0, 1
        self.add(found)

    def uncovered_lines(self) -> list[str]:
        """'module: namespace::op (compiled graph)', as kernel_coverage lists what was not covered."""
        return [f"{module}: {op} (compiled graph)" for module, op in sorted(self.uncovered)]

    def to_json(self) -> dict:
        return {"graphs_inspected": self.inspected, "graphs_from_store": self.stored,
                "routed": self.routed, "row_independent": self.row_independent,
                "uncovered": [{"module": m, "op": op, "calls": n} for (m, op), n in sorted(self.uncovered.items())],
                "unreviewed": dict(sorted(self.unreviewed.items()))}


class _Pass(CustomGraphPass):
    """Inductor's post-grad custom pass (config.post_grad_custom_pre_pass): reads the graph, changes
    nothing. uuid (part of Inductor's cache key): this file's text, so a changed census is a new cache
    entry; while a census collects, also its store's key (census_store.py), or None where a census has
    no store, so Inductor's caches neither serve nor keep those graphs (a graph served from a cache is
    never traced, and the census would see nothing). A CustomGraphPass: Inductor's caches take no other
    kind of pass (before, every graph compiled under the mode bypassed them)."""

    def __init__(self, then=None):
        self.then = then  # no lock or other unpicklable state: Inductor copies its config

    def __call__(self, graph) -> None:
        if _COLLECTING:
            found = GraphCensus(inspected=1)
            for node in graph.nodes:
                if node.op == "call_function":
                    _sort(found, node)
            digest = None
            for census in _COLLECTING:
                census.add(found)
                if census.store is not None:
                    from nondet.kernels.census_store import graph_digest

                    digest = digest or graph_digest(graph)
                    census.store.append(digest, found.to_json())
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        stores = {c.store.identity() if c.store is not None else None for c in _COLLECTING}
        if None in stores or len(stores) > 1:
            return None
        with open(__file__, "rb") as source:
            mine = hashlib.sha256(source.read()).hexdigest() + "".join(sorted(stores))
        theirs = self.then.uuid() if self.then is not None and hasattr(self.then, "uuid") else None
        return mine if self.then is None else (mine, theirs)


def inductor_pass(existing=None) -> _Pass:
    """The pass to set as post_grad_custom_pre_pass (traced.traced_scope does); a pass the user had set
    runs after it."""
    return existing if isinstance(existing, _Pass) else _Pass(existing)


@contextlib.contextmanager
def collecting(census: GraphCensus):
    """For the body, every graph Inductor compiles under the traced mode is sorted into `census`; with
    census.store, the store's findings are added first (once per census) and each new graph is kept."""
    if census.store is not None and not census.store_read:
        census.store_read = True
        for entry in census.store.entries():
            census.add_stored(entry)
    _COLLECTING.append(census)
    try:
        yield census
    finally:
        _COLLECTING.remove(census)


def _sort(census: GraphCensus, node) -> None:
    target = node.target
    if getattr(target, "__name__", "") in _KERNEL_WRAPPERS:
        fn = _kernel_fn(node)
        if str(getattr(fn, "__module__", "")).startswith("nondet.kernels"):
            census.routed += 1
        else:
            census.unreviewed[f"triton kernel {getattr(fn, '__qualname__', '?')}"] += 1
        return
    if not isinstance(target, torch._ops.OpOverload):
        return  # operator.getitem and other Python plumbing
    namespace, op = target.namespace, op_kinds.base_name(target)
    if namespace == "nondet":
        census.routed += 1
    elif namespace == "symm_mem":  # the mode's all-reduce as one kernel, where this process set it up
        if op == symmetric_sum.ONE_SHOT_OP and symmetric_sum.route() is not None:
            census.routed += 1  # its bits checked against the gathered sum at set-up (symmetric_sum.py)
        else:
            census.uncovered[(_module_of(node), f"{namespace}::{op}")] += 1
    elif namespace in COLLECTIVE_NAMESPACES:  # as the eager census sorts them (a copy; an embedding's exact sum)
        if collective_kind(op, _module_type(node))[0] == ROW_INDEPENDENT:
            census.row_independent += 1
        else:
            census.uncovered[(_module_of(node), f"{namespace}::{op}")] += 1
    elif namespace == "prims" and op in _PRIMS_ROW_INDEPENDENT:
        census.row_independent += 1
    else:
        args, kwargs = _values(node)
        if op in REDUCING and not op_kinds.integral_only(args, kwargs):
            census.uncovered[(_module_of(node), f"{namespace}::{op}")] += 1
        elif _row_independent(target, args, kwargs):
            census.row_independent += 1
        else:
            census.unreviewed[f"{namespace}::{op}"] += 1


def _row_independent(target, args, kwargs) -> bool:
    try:
        return op_kinds.row_independent(target, args, kwargs) is not None
    except (IndexError, AttributeError, TypeError):
        return False


def _values(node):
    """The node's arguments with each graph node replaced by its fake value (shapes and dtypes)."""
    from torch.fx.node import map_arg

    def value(arg):
        return arg.meta.get("val")

    return map_arg(node.args, value), map_arg(node.kwargs, value)


def _module_of(node) -> str:
    """The innermost module that called the op, as dynamo recorded it ('?' where the graph lost it)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "?"
    path = list(stack.values())[-1][0]
    return str(path).replace("L['self'].", "").replace("L['self']", "model") or "?"


def _module_type(node):
    """The class of the innermost module that called the op (None where the graph lost it)."""
    stack = node.meta.get("nn_module_stack") or {}
    kind = list(stack.values())[-1][1] if stack else None
    return kind if isinstance(kind, type) else None


def _kernel_fn(node):
    """The Python function of the Triton kernel a kernel-wrapper node launches (None if unknown)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    try:
        kernel = kernel_side_table.get_kernel(node.kwargs.get("kernel_idx"))
    except (KeyError, AssertionError, TypeError):
        return None
    return getattr(kernel, "fn", kernel)
