"""The invariant kernels as PyTorch custom ops, so a traced graph (torch.compile) keeps them opaque.

The mode's aten overrides sit on the CPU / CUDA dispatch keys; torch.compile traces with fake
tensors, so its graph holds plain aten.mm / aten.mean / aten._softmax and Inductor lowers them with
its own reductions (extern mm calls go through `.out` overloads, which the overrides leave to the
original kernels). Under compile the mode's numerics must enter the graph as ops Inductor cannot
look into: these. Each runs the same function as nondet.kernels.ops (the same bits as eager under
the mode) and has a fake implementation for tracing. Registration happens on first use
(`ensure_registered`), never at import.
"""

import torch

_REGISTERED = {}


def ensure_registered() -> None:
    """Define the nondet:: custom ops once (idempotent)."""
    if _REGISTERED:
        return
    from nondet.kernels import ops

    @torch.library.custom_op("nondet::mm", mutates_args=())
    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.mm(a, b)

    @mm.register_fake
    def _(a, b):
        return a.new_empty((a.shape[0], b.shape[1]))

    @torch.library.custom_op("nondet::addmm", mutates_args=())
    def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.addmm(bias, a, b)

    @addmm.register_fake
    def _(bias, a, b):
        return a.new_empty((a.shape[0], b.shape[1]))

    @torch.library.custom_op("nondet::layer_norm", mutates_args=())
    def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> torch.Tensor:
        return ops.layer_norm(x, weight, bias, eps)

    @layer_norm.register_fake
    def _(x, weight, bias, eps):
        return x.new_empty(x.shape)

    @torch.library.custom_op("nondet::bmm", mutates_args=())
    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.bmm(a, b)

    @bmm.register_fake
    def _(a, b):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    @torch.library.custom_op("nondet::mean_last", mutates_args=())
    def mean_last(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
        return ops.mean_last(x, keepdim)

    @mean_last.register_fake
    def _(x, keepdim):
        return x.new_empty((*x.shape[:-1], 1) if keepdim else x.shape[:-1])

    @torch.library.custom_op("nondet::softmax", mutates_args=())
    def softmax(x: torch.Tensor, log: bool) -> torch.Tensor:
        return (ops.log_softmax if log else ops.softmax)(x)

    @softmax.register_fake
    def _(x, log):
        return x.new_empty(x.shape)

    @torch.library.custom_op("nondet::attention", mutates_args=())
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                  is_causal: bool, softcap: float | None, sinks: torch.Tensor | None,
                  sliding: bool) -> torch.Tensor:
        return ops.attention(q, k, v, mask, scale, is_causal, softcap=softcap, sinks=sinks, sliding=sliding)

    @attention.register_fake
    def _(q, k, v, mask, scale, is_causal, softcap, sinks, sliding):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3]))

    _REGISTERED.update(mm=mm, addmm=addmm, layer_norm=layer_norm, bmm=bmm, mean_last=mean_last, softmax=softmax, attention=attention)
