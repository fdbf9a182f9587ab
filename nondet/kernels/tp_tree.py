"""TP-invariance: row-parallel linears reduce K as one fixed tree that every TP degree follows.

Under tensor parallelism a row-parallel linear (Qwen3: o_proj, down_proj) splits K over the
ranks: rank r computes its K slice's product, rounded to the output dtype, and the all-reduce
sums the ranks' partials. One GPU computes the whole K in one product. Different roundings,
so TP1 and TP2 differ in the last bits from the first layer (docs/benchmarks.md).

Here K is cut into `leaves` equal chunks (a power of 2, the largest TP degree compared). Each
leaf is one product in the mode's invariant kernels (all of them one batched launch, ops.bmm: a
batch entry has its own mm's bits), rounded to the output dtype, as a rank's partial is; leaves
are combined pairwise, ((l0 + l1) + (l2 + l3)), each node an fp32 add rounded once to the dtype.
At degree d a rank holds leaves/d adjacent leaves and computes their subtree; the all-reduce then
combines the ranks' roots with the same pairwise rule (collective.py, tree mode), so TP1, TP2 and
TP4 compute the same tree, bit for bit. Where a rank
holds more than one leaf (TP1 under a tree of 2), each weight's K chunks are contiguous copies laid
out as a rank's shard is, made once and held while the weight lives (held_chunks), rather than at every
call: a traced step reads them as static inputs instead of copying every row-parallel weight (memory:
their size again, for as long as the model is loaded).

The switch: a forward pre-hook on each row-parallel module (named by the model's tp plan)
turns the tree on for the F.linear call inside it, and a forward hook turns it off; F.linear
is wrapped only inside `tree_linears` and restored in `finally`. A plan that shards a parameter
row-wise inside a module (a fused MoE's experts.down_proj) gets the same tree through the experts'
forward (tp_experts.py), or a one-line refusal where that layout is not covered. Nothing happens
at import.
"""

import contextlib
import fnmatch

import torch
from torch.utils.weak import WeakIdKeyDictionary

from nondet.kernels import custom_ops, experts, held_weights, tp_experts
from nondet.kernels.rounded_tree import pairwise_tree

# weight -> (((leaves,), its version), its K chunks): held while the weight lives (held_chunks, held_weights.py)
_HELD = WeakIdKeyDictionary()
_STATE = {"leaves": 0, "chunks": None}  # the call in progress: its leaves (0: a plain F.linear) and
# its weight's K chunks (made once per module by tree_linears; None: made at the call)


def tree_linear(x: torch.Tensor, weight: torch.Tensor, leaves: int,
                chunks: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T as a pairwise tree of `leaves` K chunks (see the module doc).
    chunks: weight's k_chunks, made once (tree_linears), else made here at every call."""
    from nondet.kernels import ops, traced

    traced_now = torch.compiler.is_compiling()
    if leaves == 1:  # a rank's one leaf: its plain product (traced, the mode's opaque op, as ops.linear's
        # host code, Triton launches on CUDA or aten's mm.out on the CPU, is nothing a graph may hold)
        return (traced.opaque_linear if traced_now else ops.linear)(x, weight)
    chunks = chunks if chunks is not None else k_chunks(weight, leaves)
    rows = x.reshape(-1, x.shape[-1])
    # (leaves, M, K / leaves), a view: the kernels read by strides (the CPU's copy each row block, the GPU's
    # split and plain launches load the same values either way; a batched launch never takes TMA). K / leaves
    # spelled out, not -1, so that zero rows reshape too
    a = rows.reshape(rows.shape[0], leaves, chunks.shape[2]).transpose(0, 1)
    b = chunks.transpose(1, 2)  # (leaves, K / leaves, N): each leaf's weight.t(), as a rank's linear reads it
    # One batched launch for every leaf (a batch entry has its own mm's bits: the K order is the dtype's,
    # whatever the launch): one launch per leaf left TP1 under a tree of 2 1.5x the default's step at the
    # 8B shape (H200, 2026-11-29, docs/benchmarks.md)
    parts = traced.op("bmm", a, b)(a, b) if traced_now else ops.bmm(a, b)
    return pairwise_tree(list(parts.unbind(0))).reshape(*x.shape[:-1], weight.shape[0])


def k_chunks(weight: torch.Tensor, leaves: int) -> torch.Tensor:
    """weight (N, K) cut into `leaves` contiguous (N, K / leaves) copies, stacked (leaves, N, K / leaves):
    each leaf's product then reads a weight laid out as a rank's shard is (so it has that rank's bits)."""
    n, k = weight.shape
    if k % leaves:
        raise ValueError(f"a row-parallel linear's K ({k}) does not split into {leaves} equal chunks")
    return weight.reshape(n, leaves, k // leaves).transpose(0, 1).contiguous()


def held_chunks(weight: torch.Tensor, leaves: int) -> torch.Tensor:
    """k_chunks of a module's weight (of its local shard, for a DTensor), made once while the weight lives
    and keeps its values (the tree's scopes of later conditions reuse them), as a static Parameter."""
    return held_weights.held(_HELD, weight, (leaves,),
                             lambda: held_weights.static(k_chunks(held_weights.local(weight), leaves)))


def _rowwise_patterns(model) -> list[str]:
    plan = dict(getattr(model, "tp_plan", None) or getattr(model.config, "base_model_tp_plan", None) or {})
    return [p if p.startswith("model.") else f"model.{p}" for p, style in plan.items()
            if str(style).startswith("rowwise")]


def rowwise_module_names(model) -> list[str]:
    """Modules the model's tensor-parallel plan shards row-wise (their K is split over ranks)."""
    patterns = _rowwise_patterns(model)
    return [name for name, _ in model.named_modules() if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


def rowwise_parameters(model) -> list[tuple[str, str]]:
    """(module name, parameter name) of the parameters the plan shards row-wise by name, inside a module
    it does not (Qwen3-MoE: "layers.*.mlp.experts.down_proj", a 3-D parameter of the fused experts)."""
    patterns = _rowwise_patterns(model)
    return [(module_name, name) for module_name, module in model.named_modules()
            for name, _ in module.named_parameters(recurse=False)
            if any(fnmatch.fnmatchcase(f"{module_name}.{name}", p) for p in patterns)]


def experts_module_names(model) -> list[str]:
    """Experts modules whose row-parallel down_proj the tree covers (tp_experts.py); raises ValueError,
    one line, for any other row-parallel parameter: --tp-invariant refuses what it would not make equal."""
    names = []
    for module_name, parameter in rowwise_parameters(model):
        reason = uncovered_reason(model.get_submodule(module_name), parameter)
        if reason:
            raise ValueError(f"--tp-invariant does not cover {module_name}.{parameter}, which the tensor-parallel "
                             f"plan shards row-wise: {reason}")
        names.append(module_name)
    return names


def uncovered_reason(module, parameter: str) -> str | None:
    """Why the tree cannot cover a row-parallel `parameter` of `module`, or None when it can."""
    if not experts.is_dispatched(module):
        return "it is not an experts module that transformers' ExpertsInterface dispatches"
    if parameter != "down_proj":
        return f"only an experts module's down_proj is covered, not {parameter}"
    for flag, expected in (("is_transposed", False), ("has_bias", False), ("has_post_expert_norm", False),
                           ("is_concatenated", True)):
        if getattr(module, flag, expected) != expected:
            return f"its experts layout has {flag}={not expected}"
    if getattr(module, "has_gate", True) and not _default_gate(module):
        return "its experts apply their own gate to the gate / up projection"
    return None


def _default_gate(module) -> bool:
    from transformers.integrations import moe

    default = getattr(moe, "_default_apply_gate", None)
    return default is not None and getattr(type(module), "_apply_gate", None) is default


def overridable_functions_listed() -> None:
    """Have torch (and dynamo) list the functions a TorchFunctionMode may override, once per process, now.
    They read F.linear when they first list them: listed while tree_linears' stand-in is F.linear, the
    builtin linear would be missing for the rest of the process, and every later trace would leave F.linear
    outside the mode (the builtin linear in the graph, not the mode's kernels)."""
    torch.overrides.get_overridable_functions()
    from torch._dynamo.variables import torch as dynamo_torch

    listed = getattr(dynamo_torch, "get_overridable_functions", None)  # dynamo's own copy of that list
    if listed is not None:
        listed()


@contextlib.contextmanager
def tree_linears(model, leaves: int):
    """Row-parallel linears of `model` reduce K as a tree of `leaves` chunks (this rank's share)."""
    import torch.nn.functional as F

    custom_ops.ensure_registered()  # the tree's traced nodes (pairwise_tree)
    names, experts_names = rowwise_module_names(model), experts_module_names(model)
    if not names and not experts_names:
        raise ValueError("the model has no row-parallel linears in its tensor-parallel plan")
    original, hooks = F.linear, []

    def linear(x, weight, bias=None):
        if not _STATE["leaves"]:
            if torch.compiler.is_compiling():
                # Traced, a call from this Python stand-in does not reach the mode's TorchFunctionMode
                # (torch 2.13: the builtin linear stayed in the graph, where Inductor picks its own mm),
                # so it is routed here as the mode routes F.linear: the tree is only ever on inside the mode
                from nondet.kernels import traced

                return traced.opaque_linear(x, weight, bias)
            return original(x, weight, bias)
        made = _STATE["chunks"]  # the module's chunks, where they are this weight's (the module's weight then and now)
        chunks = made[1] if made is not None and made[0] is weight else None
        out = tree_linear(x, held_weights.local(weight), _STATE["leaves"], chunks)
        return out if bias is None else out + bias  # TP hides the bias until after the all-reduce

    def on_for(module):
        # More than one leaf here (TP1 under a tree of 2, TP2 under 4): the chunks are copies made once,
        # not at every call (a copy of every row-parallel weight per step; they cost their size in memory)
        weight = getattr(module, "weight", None)
        made = (weight, held_chunks(weight, leaves)) if leaves > 1 and weight is not None else None

        def on(_module, _args):
            _STATE["leaves"], _STATE["chunks"] = leaves, made
        return on

    def off(_module, _args, _out):
        _STATE["leaves"], _STATE["chunks"] = 0, None

    def experts_on_for(module):
        made = (module, tp_experts.held_leaves(module, leaves))  # made once, as the linears' chunks are

        def on(_module, _args):
            tp_experts.set_leaves(leaves, made)
        return on

    def experts_off(_module, _args, _out):
        tp_experts.set_leaves(0)

    try:
        overridable_functions_listed()  # before the swap: torch lists them once per process
        F.linear = linear
        for name in names:
            module = model.get_submodule(name)
            hooks += [module.register_forward_pre_hook(on_for(module)), module.register_forward_hook(off)]
        for name in experts_names:
            module = model.get_submodule(name)
            hooks += [module.register_forward_pre_hook(experts_on_for(module)), module.register_forward_hook(experts_off)]
        yield names + experts_names
    finally:
        F.linear = original
        _STATE["leaves"], _STATE["chunks"] = 0, None
        tp_experts.set_leaves(0)
        for hook in hooks:
            hook.remove()
