"""Plain torch references for every op: what each kernel must compute, in fp64 or fp32.

Tests compare kernels against these by relative error; none of them is batch-invariant by
construction, and none is used on the invariant path.
"""

import math

import torch


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = a.double() @ b.double()
    return out if bias is None else out + bias.double()


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a.double(), b.double())


def mean_last(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    return x.double().mean(-1, keepdim=keepdim)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xd = x.double()
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def layer_norm(x: torch.Tensor, weight, bias, eps: float) -> torch.Tensor:
    xd = x.double()
    y = (xd - xd.mean(-1, keepdim=True)) * torch.rsqrt(xd.var(-1, unbiased=False, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return y if bias is None else y + bias.double()


def softmax(x: torch.Tensor, log: bool = False) -> torch.Tensor:
    return torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)


def attention(q, k, v, mask=None, scale=None) -> torch.Tensor:
    """q (B, H, Q, D), k/v (B, KVH, S, D) -> (B, Q, H, D); mask None = causal (bottom-right)."""
    nq, s, d = q.shape[2], k.shape[2], q.shape[3]
    g = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(g, 1)
    vd = v.double().repeat_interleave(g, 1)
    scores = q.double() @ kd.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if mask is None:
        mask = torch.ones(nq, s, dtype=torch.bool, device=q.device).tril(s - nq)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.double()
    probs = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    return (probs @ vd).transpose(1, 2)
