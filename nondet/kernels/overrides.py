"""aten kernels the mode installs on the CPU and CUDA dispatch keys, grouped by op class.

Each override handles the cases that matter for batch invariance (float tensors, reductions
over the last dim) and sends everything else to the ORIGINAL kernel through the op's `.out`
overload, which is never overridden, so an override cannot recurse into itself.

Why these ops: a transformers decoder (Qwen3, Llama, Mistral, Gemma) reduces only in
nn.Linear (aten::linear decomposes to mm / addmm, or to matmul -> mm / bmm), in RMSNorm
(`x.pow(2).mean(-1)` -> mean.dim), in rotary embeddings (matmul -> bmm), in attention
(handled through transformers' attention interface, see hf.py) and in softmax /
log_softmax on the logits. LayerNorm and F.rms_norm models go through native_layer_norm
and _fused_rms_norm. Everything else in those forwards is elementwise or a gather, which is
batch-invariant already.

Only forwards are made invariant: inside autograd's backward (the gradients of a trainer's
step) the matmuls, row means and softmaxes take the original kernels, since only
the forward logprobs must match the sampler's and cuBLAS is faster on the backward's shapes
(weight gradients reduce over all the micro-batch's tokens).
"""

import torch

from nondet.kernels import cpu, ops, router, sdpa

aten = torch.ops.aten


def _empty(like: torch.Tensor, dtype=None) -> torch.Tensor:
    return torch.empty(0, dtype=dtype or like.dtype, device=like.device)


def _ours(*ts: torch.Tensor) -> bool:
    """Ours to compute: one float dtype, and not inside a backward pass (module docstring)."""
    return (all(t.dtype in ops.TRITON_DTYPES for t in ts) and len({t.dtype for t in ts}) == 1
            and torch._C._current_autograd_node() is None)


def _takes_mm(self, mat2):
    return _ours(self, mat2)


def mm(self, mat2):
    if not _takes_mm(self, mat2):
        return aten.mm.out(self, mat2, out=_empty(self))
    return ops.mm(self, mat2)


def _takes_addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _ours(mat1, mat2) and self.dtype == mat1.dtype


def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if not _takes_addmm(self, mat1, mat2):
        return aten.addmm.out(self, mat1, mat2, beta=beta, alpha=alpha, out=_empty(mat1))
    return ops.addmm(self, mat1, mat2, beta=beta, alpha=alpha)


def bmm(self, mat2):
    if not _takes_mm(self, mat2):
        return aten.bmm.out(self, mat2, out=_empty(self))
    return ops.bmm(self, mat2)


def _takes_baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _ours(batch1, batch2) and self.dtype == batch1.dtype


def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """beta * self + alpha * (batch1 @ batch2) (Bloom's ALiBi scores): the invariant bmm, then the
    elementwise combination (one more rounding than a fused kernel, the same at every batch size)."""
    if not _takes_baddbmm(self, batch1, batch2):
        return aten.baddbmm.out(self, batch1, batch2, beta=beta, alpha=alpha, out=_empty(batch1))
    product = ops.bmm(batch1, batch2)
    product = product if alpha == 1 else product * alpha
    return product if beta == 0 else product + (self if beta == 1 else self * beta)


def _is_last(dim, ndim: int) -> bool:
    return ndim >= 1 and dim is not None and len(dim) == 1 and dim[0] % ndim == ndim - 1


def _takes_mean(self, dim, keepdim=False, *, dtype=None):
    return _is_last(dim, self.dim()) and _ours(self) and self.numel() > 0


def mean_dim(self, dim, keepdim=False, *, dtype=None):
    if not _takes_mean(self, dim):
        return aten.mean.out(self, dim, keepdim, dtype=dtype, out=_empty(self, dtype))
    return ops.mean_last(self, keepdim, dtype)


def _takes_sum(self, dim, keepdim=False, *, dtype=None):
    return (_is_last(dim, self.dim()) and _ours(self) and self.numel() > 0
            and (dtype is None or dtype in ops.TRITON_DTYPES))


def sum_dim(self, dim, keepdim=False, *, dtype=None):
    if not _takes_sum(self, dim, keepdim, dtype=dtype):
        # as torch: a bool or integer tensor sums to int64 (transformers 5.17's assisted decoding
        # subtracts its bool mask's sum: a bool result raised there)
        widened = dtype or (torch.int64 if not (self.is_floating_point() or self.is_complex()) else None)
        return aten.sum.IntList_out(self, dim, keepdim, dtype=dtype, out=_empty(self, widened))
    return ops.sum_last(self, keepdim, dtype)


def _takes_softmax(self, dim, half_to_float):
    return _is_last([dim], self.dim()) and _ours(self) and self.numel() > 0


def _softmax(self, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else self.dtype
    if not _takes_softmax(self, dim, half_to_float):
        return aten._softmax.out(self, dim, half_to_float, out=_empty(self, out_dtype))
    return ops.softmax(self, dtype=out_dtype)


def _log_softmax(self, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else self.dtype
    if not _takes_softmax(self, dim, half_to_float):
        return aten._log_softmax.out(self, dim, half_to_float, out=_empty(self, out_dtype))
    return ops.log_softmax(self, dtype=out_dtype)


def native_layer_norm(input, normalized_shape, weight, bias, eps):
    if input.is_cuda and _ours(input) and input.numel() > 0:
        from nondet.kernels import triton_rows

        n = 1
        for size in normalized_shape:
            n *= size
        x = input.reshape(*input.shape[: input.dim() - len(normalized_shape)], n)
        w = None if weight is None else weight.reshape(n)
        b = None if bias is None else bias.reshape(n)
        y, mean, rstd = triton_rows.layer_norm(x, w, b, eps)
        stat_shape = (*x.shape[:-1], *([1] * len(normalized_shape)))
        return y.reshape(input.shape), mean.reshape(stat_shape), rstd.reshape(stat_shape)
    from nondet.kernels import cpu  # composed from the invariant row mean, any device

    return cpu.native_layer_norm(input, normalized_shape, weight, bias, eps)


def _fused_rms_norm(input, normalized_shape, weight, eps):
    # No .out overload exists: composed from the invariant row mean, fp32 inside.
    eps = torch.finfo(input.dtype).eps if eps is None else eps
    n = 1
    for size in normalized_shape:
        n *= size
    lead = input.shape[: input.dim() - len(normalized_shape)]
    x = input.reshape(*lead, n).float()
    rstd = torch.rsqrt(ops.mean_last(x * x, keepdim=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * weight.reshape(n).float()
    stat_shape = (*lead, *([1] * len(normalized_shape)))
    return y.to(input.dtype).reshape(input.shape), rstd.reshape(stat_shape)


def _takes_safe_softmax(self, dim, dtype=None):
    return _takes_softmax(self, dim, False) and dtype in (None, self.dtype, torch.float32)


def _safe_softmax(self, dim, dtype=None):
    """SDPA's math path: a softmax whose fully masked rows (all -inf) are 0 instead of NaN."""
    if _takes_safe_softmax(self, dim, dtype):
        out = ops.softmax(self, dtype=dtype or self.dtype)
    else:  # the original arithmetic (no .out overload of _safe_softmax to hand it to)
        x = self if dtype is None else self.to(dtype)
        out = aten._softmax.out(x, dim, False, out=_empty(x))
    return out.masked_fill(torch.isinf(self).logical_and(self < 0).all(dim, keepdim=True), 0.0)


# op class -> [(aten op name with overload, kernel)]
OP_TABLE = {
    "matmul": [("mm", mm), ("addmm", addmm), ("bmm", bmm), ("baddbmm", baddbmm)],
    "norm": [("mean.dim", mean_dim), ("sum.dim_IntList", sum_dim), ("native_layer_norm", native_layer_norm),
             ("_fused_rms_norm", _fused_rms_norm)],
    "softmax": [("_softmax", _softmax), ("_log_softmax", _log_softmax)],
    # transformers' attention interface (hf.py); a direct SDPA call at its composite key (sdpa.py), and
    # SDPA's math path's softmax when the call is not ours to take
    "attention": [(sdpa.NAME, sdpa.attention), ("_safe_softmax", _safe_softmax)],
    "experts": [],  # through transformers' ExpertsInterface (experts.py), not aten
    "router": [("topk", router.topk)],
    # CPU only: ops whose vectorized loop body and scalar tail round differently (cpu.POSITION_DEPENDENT),
    # computed with every element in the vector body, so a row's bits do not follow the call's length
    "elementwise": [(name, cpu.pointwise_override(name)) for name in cpu.POINTWISE_OPS],  # ties by lowest index; the router's forward is wrapped too (router.py)
}

DISPATCH_KEYS = ("CPU", "CUDA")


def _always(*args, **kwargs) -> bool:
    return True


# aten op name -> whether its override computes this call with the invariant kernel (same signature as
# the kernel); a call it hands back to the original kernel is not covered. The census (census.py) asks.
TAKES = {"mm": _takes_mm, "addmm": _takes_addmm, "bmm": _takes_mm, "mean.dim": _takes_mean,
         "_softmax": _takes_softmax, "_log_softmax": _takes_softmax, "native_layer_norm": _always,
         "_fused_rms_norm": _always, "topk": router.takes_topk, "baddbmm": _takes_baddbmm,
         "sum.dim_IntList": _takes_sum, "_safe_softmax": _takes_safe_softmax, sdpa.NAME: sdpa.takes}
# ops whose override sits at another dispatch key than DISPATCH_KEYS
KEY_OF = {sdpa.NAME: (sdpa.DISPATCH_KEY,), **{name: ("CPU",) for name in cpu.POINTWISE_OPS}}
TAKES.update({name: cpu.pointwise_takes(name) for name in cpu.POINTWISE_OPS})


def op_class_of(name: str) -> str | None:
    """The op class whose override handles aten op `name` ('mm', 'mean.dim', ...), or None."""
    for cls, entries in OP_TABLE.items():
        if any(entry_name == name for entry_name, _ in entries):
            return cls
    return None


def available(name: str) -> bool:
    """Whether this torch build has the aten op (`_fused_rms_norm` is recent)."""
    base, _, overload = name.partition(".")
    packet = getattr(aten, base, None)
    return packet is not None and (overload or "default") in packet.overloads()
