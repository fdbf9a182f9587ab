"""Autograd for the invariant attention: a training forward under the mode.

The invariant attention paths (cpu.attention, triton_attention) call `.out` kernels and
Triton launches, which autograd cannot trace. A trainer's teacher-forced forward needs
gradients, so `attention` wraps them in an autograd Function: the forward is the invariant
path itself (its bits are exactly those of inference, which is what makes sampler and
trainer logprobs match), the backward recomputes plain fp32 attention with autograd and
differentiates that. Only the forward must be batch-invariant; the backward may use any
kernels, so gradients are close to (not bitwise) the default kernels'.
"""

import math

import torch

from nondet.kernels import ops


class _InvariantAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale, is_causal, softcap, sinks, sliding):
        ctx.save_for_backward(q, k, v, sinks)
        ctx.mask, ctx.scale, ctx.is_causal, ctx.softcap = mask, scale, is_causal, softcap
        with torch.no_grad():
            return ops.attention(q, k, v, mask, scale=scale, is_causal=is_causal, softcap=softcap, sinks=sinks,
                                 sliding=sliding)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, sinks = ctx.saved_tensors
        tensors = (q, k, v, sinks)
        with torch.enable_grad():
            leaves = [None if t is None else t.detach().requires_grad_(t.requires_grad) for t in tensors]
            out = plain_attention(*leaves[:3], ctx.mask, ctx.scale, ctx.is_causal, ctx.softcap, leaves[3])
            wanted = [t for t in leaves if t is not None and t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out.to(out.dtype)) if wanted else ())
        q_g, k_g, v_g, sinks_g = [next(grads).to(t.dtype) if t is not None and t.requires_grad else None
                                  for t in leaves]
        return q_g, k_g, v_g, None, None, None, None, sinks_g, None  # mask, scale, flags: no gradient


def plain_attention(q, k, v, mask, scale, is_causal, softcap=None, sinks=None):
    """Differentiable fp32 attention with ops.attention's semantics -> (B, Q, H, D) in q's dtype."""
    nq, s, d = q.shape[2], k.shape[2], q.shape[3]
    g = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    scores = q.float() @ kf.transpose(-1, -2) * (1.0 / math.sqrt(d) if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(nq, s, dtype=torch.bool, device=q.device)
        mask = mask.tril(s - nq) if is_causal else mask
    mask = mask[..., :s]
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    if sinks is not None:  # a per-head column in the denominator, dropped after the softmax
        column = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.nan_to_num(torch.cat([scores, column], -1).softmax(-1)[..., :-1], nan=0.0)
    else:
        probs = torch.nan_to_num(scores.softmax(-1), nan=0.0)  # padding queries attend to nothing
    return (probs @ vf).transpose(1, 2).to(q.dtype)


def attention(q, k, v, mask=None, scale=None, is_causal=True, softcap=None, sinks=None, sliding=False):
    """ops.attention with a backward: invariant forward bits, plain fp32 gradients."""
    return _InvariantAttention.apply(q, k, v, mask, scale, is_causal, softcap, sinks, sliding)
