"""The MoE router under the mode: its arithmetic invariant, and top-k ties broken by expert index.

A router (Qwen3MoeTopKRouter, MixtralTopKRouter, DeepseekV3TopkRouter, GptOssTopKRouter, ...)
is a linear layer, a softmax or sigmoid and a top-k. A 1-ULP change of its logits can flip a
token's expert set, so the router is its own op class ("router"): with it on,

- aten::topk takes a defined order: a stable descending sort, so equal values keep ascending
  index order and the lowest expert index wins a tie. torch.topk's tie order is unspecified and
  may follow the shape of the call (CUDA picks radix-select or sort by size), so a tie could
  break differently for a token alone and in a batch;
- every router module's forward runs with the invariant matmul and softmax as well (a nested
  mode context), so `ops={"router"}` alone makes exactly the routing decisions invariant: what
  bisect's ablation needs to tell routing from the experts' arithmetic;
- on the CPU its elementwise ops whose vector body and scalar tail round differently (a sigmoid)
  compute on whole vectors (cpu.whole_vectors), so a token's scores do not follow the length of the
  (T, E) call.

Nothing here runs unless the mode installs it.
"""

import contextlib

import torch

from nondet.kernels import cpu

aten = torch.ops.aten

ROUTER_CLASSES = ("matmul", "softmax", "norm")  # what a router's own forward computes with (norm: the
# row sums that renormalize its top-k weights, Mixtral and DeepSeek-V3)
_WRAPPED_ATTR = "_nondet_router_forward"


def takes_topk(self, k, dim=-1, largest=True, sorted=True) -> bool:
    """Whether topk below orders ties itself (else it runs the original kernel, fine for integers)."""
    return self.dim() > 0 and self.is_floating_point()


def topk(self, k, dim=-1, largest=True, sorted=True):
    """aten::topk with ties broken by the lowest index; same values and indices set as torch.topk."""
    if not takes_topk(self, k):
        values, indices = torch.empty(0, dtype=self.dtype, device=self.device), torch.empty(
            0, dtype=torch.long, device=self.device)
        return aten.topk.values(self, k, dim, largest, sorted, values=values, indices=indices)
    ordered, order = torch.sort(self, dim=dim, descending=largest, stable=True)
    return ordered.narrow(dim, 0, k), order.narrow(dim, 0, k)


def is_router(module) -> bool:
    """A MoE router module: transformers names them *Router (TopKRouter, TopkRouter, Router)."""
    return "Router" in type(module).__name__


def routers(model) -> list:
    return [m for m in model.modules() if is_router(m)]


def wrap(model, scope) -> list:
    """Run every router's forward inside `scope(*inputs)` (a context manager factory given the forward's
    arguments); returns the modules."""
    wrapped = []
    for module in routers(model):
        if _WRAPPED_ATTR in module.__dict__:
            continue  # an outer context already wrapped it
        module.__dict__[_WRAPPED_ATTR] = True
        module.forward = _scoped_forward(module.forward, scope)
        wrapped.append(module)
    return wrapped


def _scoped_forward(original, scope):
    """`original` run inside `scope`. A plain closure under its own name, not functools.wraps's borrowed
    one: torch's saved compiled functions (probes/core/precompiled.py) restore a function found at its
    module and name, or a nested one from its code and closure; a function named as the router class's
    forward is neither, and its guards could not be rebuilt when the file was loaded."""
    def forward(*args, **kwargs):
        with scope(*args, *kwargs.values()):
            return original(*args, **kwargs)

    return forward


def unwrap(modules: list) -> None:
    for module in modules:
        module.__dict__.pop("forward", None)
        module.__dict__.pop(_WRAPPED_ATTR, None)


def router_scope(active_ops, batch_invariant):
    """A context factory: the router's own classes on top of whatever is active (nothing more when they
    are), and on the CPU its elementwise ops on whole vectors (cpu.whole_vectors): DeepSeek-V3's sigmoid
    over the (T, E) logits is otherwise all scalar tail for one token and all vector body for four, 1 ulp
    apart on AVX-512, which moves the top-k weights."""

    @contextlib.contextmanager
    def scope(*inputs):
        ops = active_ops()
        if "router" not in ops:
            yield
            return
        own = contextlib.nullcontext() if set(ROUTER_CLASSES) <= ops else batch_invariant(ops=ops | set(ROUTER_CLASSES))
        with own, cpu.whole_vectors(*inputs):
            yield

    return scope
