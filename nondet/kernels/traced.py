"""The mode inside torch.compile: a TorchFunctionMode that sends the model's reductions to the
nondet:: custom ops (custom_ops.py), so a traced graph holds them as opaque calls.

torch.compile (dynamo) traces through an active TorchFunctionMode, so the functions a transformers
model calls (F.linear, torch.matmul, Tensor.mean over the last dim, softmax / log_softmax, F.layer_norm,
torch.topk) become nondet:: ops in the graph, each computing exactly what the eager mode's aten
overrides compute (an RMSNorm's mean of x.float().pow(2) becomes one op reading x: squares.py).
Inductor schedules around them but cannot re-derive their reductions (an RMSNorm's mean, a softmax)
in its own order. Everything else (elementwise ops, gathers) Inductor compiles as usual. Used by
`batch_invariant(..., traceable=True)`; in eager the aten overrides do the same work.

Inductor's elementwise code must round like eager too: by default it keeps a fused chain of bf16
ops in fp32 and picks fusions by shape, so on an H100 row 0 of a compiled Qwen3 differed alone and in
a batch of 8 (fp32 and bf16) although every reduction was ours. With `emulate_precision_casts` it
rounds where eager rounds: row 0 invariant in both dtypes and, in bf16, equal to the eager mode's bits
(fp32: 5e-6 apart, Inductor's own elementwise math). `traced_scope` sets it for the body.
"""

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from nondet.kernels import custom_ops, sdpa
# by name, not as `squares.<name>`: dynamo reached the module both as traced's attribute and as its own
# globals and guarded the pair once per inlined call (DUPLICATE_INPUT, 1794 of a TP1 step's 4028 guards at 8
# layers; the guard check's latency did not move, CPU 2026-11-30)
from nondet.kernels.squares import TAGS, mark_writes, squared_source, tagger_name

op = custom_ops.op  # the nondet:: op for these tensors (its _gpu triton_op on CUDA)


def opaque_linear(x, weight, bias=None):
    """F.linear as the nondet:: mm / addmm a traced graph keeps opaque (the eager mode's kernels)."""
    rows = x.reshape(-1, x.shape[-1])
    if bias is None:
        out = op("mm", rows, weight)(rows, weight.t())
    else:
        out = op("addmm", rows, weight)(bias, rows, weight.t())
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _matmul(a, b):
    if a.dim() == 2 and b.dim() == 2:
        return op("mm", a, b)(a, b)
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        return op("bmm", a, b)(a, b)
    if a.dim() > 2 and b.dim() == 2:  # (..., K) @ (K, N): eager folds the leading dims into rows of one mm
        # (Falcon's and GPT-J's `x @ weight.T`)
        rows = a.reshape(-1, a.shape[-1])
        return op("mm", rows, b)(rows, b).reshape(*a.shape[:-1], b.shape[-1])
    return None  # another shape: left to the compiler


def _addmm(bias, a, b, *, beta=1, alpha=1):
    """torch.addmm (GPT-2's Conv1D: bias + x @ weight) as the nondet:: addmm; scaled forms are left."""
    if beta != 1 or alpha != 1 or a.dim() != 2 or b.dim() != 2:
        return None
    return op("addmm", a, b)(bias, a, b)


def _last_dim(dim, ndim: int) -> bool:
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return len(dims) == 1 and dims[0] is not None and dims[0] % ndim == ndim - 1


def _mean(x, dim=None, keepdim=False, *, dtype=None):
    if dim is None or dtype is not None or not _last_dim(dim, x.dim()) or not x.is_floating_point():
        return None
    source = squared_source(x)  # an RMSNorm's x.float().pow(2): one op reads x (squares.py)
    if source is not None:
        return op("mean_sq", source)(source, keepdim)
    return op("mean_last", x)(x, keepdim)


def _softmax(log: bool):
    def call(x, dim=None, _stacklevel=3, dtype=None):
        if dim is None or not _last_dim(dim, x.dim()):
            return None
        x = x if dtype is None else x.to(dtype)
        return op("softmax", x)(x, log)

    return call


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if len(normalized_shape) != 1:
        return None
    return op("layer_norm", x)(x, weight, bias, eps)


def _topk(x, k, dim=-1, largest=True, sorted=True):
    ordered, order = torch.sort(x, dim=dim, descending=largest, stable=True)  # ties: lowest index first
    return ordered.narrow(dim, 0, k), order.narrow(dim, 0, k)


ROUTES = {"linear": opaque_linear, "matmul": _matmul, "addmm": _addmm, "sdpa": sdpa.traced, "mean": _mean,
          "layer_norm": _layer_norm, "softmax": _softmax(False), "log_softmax": _softmax(True), "topk": _topk}


@functools.cache
def _table(ops: frozenset) -> dict:
    """{torch function: ROUTES name} for the op classes `ops`."""
    table = {}
    if "matmul" in ops:
        # torch._C._nn.linear is F.linear's builtin: tp_tree.tree_linears swaps F.linear for a Python
        # function while it runs, and a table built then would route that one and miss the builtin
        table.update({torch._C._nn.linear: "linear", torch.matmul: "matmul", torch.Tensor.matmul: "matmul",
                      torch.Tensor.__matmul__: "matmul", torch.bmm: "matmul", torch.Tensor.bmm: "matmul",
                      torch.addmm: "addmm"})
    if "norm" in ops:
        table.update({torch.mean: "mean", torch.Tensor.mean: "mean", F.layer_norm: "layer_norm"})
    if "softmax" in ops:
        table.update({F.softmax: "softmax", torch.softmax: "softmax", torch.Tensor.softmax: "softmax",
                      F.log_softmax: "log_softmax", torch.log_softmax: "log_softmax",
                      torch.Tensor.log_softmax: "log_softmax"})
    if "router" in ops:
        table.update({torch.topk: "topk", torch.Tensor.topk: "topk"})
    if "attention" in ops:  # a direct call (Falcon's); the attention interface's path is the mode's own
        table.update({F.scaled_dot_product_attention: "sdpa"})
    return table


@torch._dynamo.assume_constant_result
def _route_name(ops: frozenset, func) -> str | None:
    """The ROUTES name for func under `ops`, or None. Dynamo keeps the answer as a constant (guarding
    `ops` alone), where looking func up in the table inline guarded every key of it (squares.py)."""
    return _table(ops).get(func)


class TracedMode(TorchFunctionMode):
    """Routes the covered torch functions to nondet:: ops for the op classes `ops`."""

    def __init__(self, ops: frozenset):
        super().__init__()
        custom_ops.ensure_registered()
        self.ops = frozenset(ops)
        self.tags = "norm" in ops  # squares.py's tags and write marks
        _never_a_frame_of_its_own()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _route_name(self.ops, func)
        if route is not None:  # training graphs too: the ops have backward formulas (custom_grads.py)
            out = ROUTES[route](*args, **kwargs)
            if out is not None:
                return out
        if not (self.tags and torch.compiler.is_compiling()):
            # At run time (cudagraph trees' bookkeeping inside a compiled call, ~20 calls a decode
            # step; a frame dynamo skipped) tags have no reader: a mean without them takes
            # mean_last over the stored squares, the bits mean_sq gives. So none are made there.
            return func(*args, **kwargs)
        mark_writes(func, args, kwargs)
        out = func(*args, **kwargs)
        tag = tagger_name(func)
        if tag is not None:
            TAGS[tag](out, args, kwargs)
        return out


def _never_a_frame_of_its_own() -> None:
    """Dynamo may inline __torch_function__ into a frame it traces, never compile it as a frame alone.

    Code that dynamo runs eagerly inside a compiled call (a frame it skipped: on Qwen3-MoE the decoder
    loop, after the experts' host sync broke the graph) calls the mode per torch function, and dynamo
    compiled each such call as its own frame, guarded on `args` but not on `func` when that is a Tensor
    method or property (torch 2.13): the graph cached for `h.float()` answered `h.dtype`, the experts
    returned fp32 and the next linear failed with "expected m1 and m2 to have the same dtype". Skipped,
    the call runs as plain Python (the same nondet ops, the eager mode's bits); frames it calls (a route,
    whose guards cover its arguments) are still compiled. Idempotent."""
    from torch._dynamo.eval_frame import skip_code

    skip_code(TracedMode.__torch_function__.__code__)


@contextlib.contextmanager
def traced_scope(ops: frozenset, compiled_calls_only: bool = False):
    """The TracedMode plus Inductor rounding like eager, for a body that compiles under the mode.

    compiled_calls_only: the TracedMode is active only inside the compiled forwards transformers'
    generate calls (`get_compiled_call`, compiled_calls below), not around the eager code of the
    body, where the aten overrides compute the same bits without a Python call per torch function."""
    import torch._inductor.config as inductor_config

    from nondet.kernels.graph_census import inductor_pass

    mode = TracedMode(ops)
    # every graph compiled under the mode is sorted by graph_census (what a caller collects)
    sorting = inductor_pass(inductor_config.post_grad_custom_pre_pass)
    with (inductor_config.patch(emulate_precision_casts=True, post_grad_custom_pre_pass=sorting),
          compiled_calls(mode) if compiled_calls_only else mode):
        yield


@contextlib.contextmanager
def compiled_calls(mode: TracedMode):
    """For the body, every transformers model's `get_compiled_call` hands out its compiled forward
    wrapped in `mode`: dynamo traces it (and guards on it) under the mode, and each call enters the
    mode for the forward only. Around it, generate's eager loop (logits processors, stopping criteria,
    the cache bookkeeping, the eager prefill) made ~95 torch calls per decode step through the mode's
    Python __torch_function__ (cProfile on an H100: 55 ms own time per 64-token call)."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.get_compiled_call

    def get_compiled_call(self, compile_config):
        return _entering(mode, original(self, compile_config))

    PreTrainedModel.get_compiled_call = get_compiled_call
    try:
        yield
    finally:
        PreTrainedModel.get_compiled_call = original


def _entering(mode: TracedMode, compiled):
    def call(*args, **kwargs):
        with mode:
            return compiled(*args, **kwargs)

    return call
