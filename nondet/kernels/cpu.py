"""Batch-invariant CPU path: every row is computed by a library call of one fixed shape.

MKL/oneDNN pick their algorithm (GEMV vs GEMM, how K is blocked, how threads split the work)
from the problem shape, so with torch 2.13 F.linear's row 0 differs between M=1 and M>=2. Here
a (M, K) operand is cut into blocks of CPU_ROW_BLOCK rows, each copied into a fresh zeroed
buffer (so the pointer alignment is the allocator's, never an offset into the caller's tensor)
and computed by the ORIGINAL kernel through its `.out` overload, which the mode does not
override, so there is no recursion. Every row meets the same shape, the same code path and the
same thread split wherever it sits in the batch. tests/test_kernels_cpu.py checks, with
torch.equal, every row against the same row computed alone, M = 1..64, fp32 and bf16.

Attention on the CPU runs one batch row and one query at a time, each query sliced to the KV
positions it may see, so every query meets exactly the shapes of a one-token decode at its
position: invariant in the batch, in the padding and in the number of query rows (a speculative
k+1 verification chunk equals k+1 one-token decodes, bit for bit).

Elementwise ops are not row-independent on a CPU either: aten's vectorized loop runs its body over
whole steps of two vectors from the start of the (coalesced) tensor and computes the rest, the
tail, with the scalar function, and for sigmoid, silu, gelu, softplus, pow, ... the two round
differently (AVX-512 fp32: 3.8% of silu's inputs, 1 ulp). So an element's bits follow its position
in the call, and a row's position and the call's length follow the batch: a (T, 8) sigmoid over a
router's logits is all tail for one token and all body for four. `pointwise` computes such an op
with every element inside a body: in chunks below aten's grain size (one thread, no chunk boundary
inside a vector), each copied into a zeroed buffer of whole CPU_VECTOR_BLOCKs; `whole_vectors()`
sends a body's calls of the POSITION_DEPENDENT ops there. tests/test_elementwise_position.py
measures which ops those are on the host's instruction set.
"""

import contextlib
import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nondet.kernels.config import CPU_ROW_BLOCK
from nondet.kernels.masks import visible

aten = torch.ops.aten


def _rows(r: int, cols: int, like: torch.Tensor, dtype=None) -> torch.Tensor:
    return torch.empty((r, cols), dtype=dtype or like.dtype, device=like.device)


def _padded(x: torch.Tensor, start: int, n: int, dtype=None) -> torch.Tensor:
    """Rows [start, start + n) of x in a fresh zeroed (CPU_ROW_BLOCK, C) buffer."""
    buf = torch.zeros((CPU_ROW_BLOCK, x.shape[1]), dtype=dtype or x.dtype, device=x.device)
    buf[:n] = x[start:start + n]
    return buf


def _blocks(r: int):
    """(start, count) of each row block; the last one is short and gets zero padding."""
    return [(s, min(CPU_ROW_BLOCK, r - s)) for s in range(0, r, CPU_ROW_BLOCK)]


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (K, N), row-blocked through aten::mm.out."""
    out = _rows(a.shape[0], b.shape[1], a)
    res = _rows(CPU_ROW_BLOCK, b.shape[1], a)
    for start, n in _blocks(a.shape[0]):
        aten.mm.out(_padded(a, start, n), b, out=res)
        out[start:start + n] = res[:n]
    return out


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta=1, alpha=1) -> torch.Tensor:
    """beta * bias + alpha * (a @ b), row-blocked through aten::addmm.out; bias rows follow a's."""
    m, n = a.shape[0], b.shape[1]
    rows_bias = bias.expand(m, n)
    out = _rows(m, n, a)
    res = _rows(CPU_ROW_BLOCK, n, a)
    for start, cnt in _blocks(m):
        aten.addmm.out(_padded(rows_bias, start, cnt), _padded(a, start, cnt), b,
                       beta=beta, alpha=alpha, out=res)
        out[start:start + cnt] = res[:cnt]
    return out


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B, M, K) @ (B, K, N), one row-blocked mm per batch entry."""
    out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=a.device)
    for i in range(a.shape[0]):
        out[i] = mm(a[i], b[i])
    return out


def mean_last(x: torch.Tensor, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    """x.mean(-1), row-blocked through aten::mean.out."""
    return row_blocked_reduce(aten.mean.out, x, keepdim, dtype)


def row_blocked_reduce(out_op, x: torch.Tensor, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    """A reduction over the last dim (aten::mean.out, aten::sum.IntList_out), row-blocked."""
    rows = x.reshape(-1, x.shape[-1])
    out_dtype = dtype or x.dtype
    out = _rows(rows.shape[0], 1, rows, out_dtype)
    res = _rows(CPU_ROW_BLOCK, 1, rows, out_dtype)
    for start, n in _blocks(rows.shape[0]):
        out_op(_padded(rows, start, n), [-1], True, dtype=dtype, out=res)
        out[start:start + n] = res[:n]
    return out.reshape((*x.shape[:-1], 1) if keepdim else x.shape[:-1])


def softmax_last(x: torch.Tensor, half_to_float: bool, log: bool) -> torch.Tensor:
    """_softmax / _log_softmax over the last dim, row-blocked through their .out overloads."""
    rows = x.reshape(-1, x.shape[-1])
    out_dtype = torch.float32 if half_to_float else x.dtype
    out = _rows(rows.shape[0], rows.shape[1], rows, out_dtype)
    res = _rows(CPU_ROW_BLOCK, rows.shape[1], rows, out_dtype)
    op = aten._log_softmax.out if log else aten._softmax.out
    for start, n in _blocks(rows.shape[0]):
        op(_padded(rows, start, n), -1, half_to_float, out=res)
        out[start:start + n] = res[:n]
    return out.reshape(x.shape)


def native_layer_norm(x, normalized_shape, weight, bias, eps):
    """aten::native_layer_norm from the row-blocked mean -> (y, mean, rstd) in x's dtype.

    (native_layer_norm.out is a wrapper around the functional op, so it cannot be the
    un-overridden path here.) fp32 inside for half types.
    """
    n = 1
    for size in normalized_shape:
        n *= size
    lead = x.shape[: x.dim() - len(normalized_shape)]
    rows = x.reshape(-1, n)
    rows = rows.double() if x.dtype == torch.float64 else rows.float()
    mean = mean_last(rows, True, None)
    centered = rows - mean
    rstd = torch.rsqrt(mean_last(centered * centered, True, None) + eps)
    y = centered * rstd
    if weight is not None:
        y = y * weight.reshape(n).to(rows.dtype)
    if bias is not None:
        y = y + bias.reshape(n).to(rows.dtype)
    stat_shape = (*lead, *([1] * len(normalized_shape)))
    return (y.to(x.dtype).reshape(x.shape), mean.to(x.dtype).reshape(stat_shape),
            rstd.to(x.dtype).reshape(stat_shape))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float, kv_start: list[int], softcap: float | None = None,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, H, Q, D), k/v (B, KVH, S, D) -> (B, Q, H, D), one batch row and one query at a time.

    Each query is computed alone over the KV positions it may see, [kv_start[b], its last visible
    position], with the shapes of a one-token decode at that position: so a row gets the same bits
    whether it is decoded alone (q_len 1), verified inside a speculative k+1 chunk, or part of a
    prefill, and whatever padding its batch has. A query's scores over a longer, masked KV range
    (a k+1 chunk) or a bmm with M = q_len differ from the decode's in the last bits on MKL.
    Each query starts at its own first visible position (a sliding window's start), so a
    sliding-window query meets the shapes of its decode too. softcap: scores become
    softcap * tanh(scores / softcap) (Gemma 2); sinks (H,): a per-head logit that joins the
    softmax denominator with no value (gpt-oss). v may have another head dim than q and k (MLA).
    Cost: O(Q) small bmm calls per row, and a copy of the visible KV per query. fp32 inside.
    """
    bsz, h, nq, _ = q.shape
    s = k.shape[2]
    g = h // k.shape[1]
    out = torch.zeros((bsz, nq, h, v.shape[-1]), dtype=q.dtype, device=q.device)
    for b in range(bsz):
        ends = _visible_ends(mask, b, nq, s)
        starts = _visible_starts(mask, b, nq, s, kv_start[b])
        for i in range(max(0, kv_start[b] - (s - nq)), nq):  # queries before the first real token are padding
            start, end = starts[i], ends[i]
            if end <= start:
                continue  # nothing to attend
            keep = None if mask is None else mask[b if mask.shape[0] > 1 else 0, 0, i, start:end]
            out[b, i] = _one_query(q[b, :, i:i + 1], k[b, :, start:end], v[b, :, start:end], keep, scale, g,
                                   softcap, sinks)
    return out


def _visible_ends(mask: torch.Tensor | None, b: int, nq: int, s: int) -> list[int]:
    """Per query, one past the last KV position it may see (causal without a mask: S - Q + i)."""
    if mask is None:
        return [s - nq + i + 1 for i in range(nq)]
    rows = mask[b if mask.shape[0] > 1 else 0, 0]  # (Q, S)
    keep = visible(rows)
    last = s - torch.flip(keep, dims=[-1]).to(torch.int32).argmax(-1)  # (Q,)
    return [int(e) if keep[i].any() else 0 for i, e in enumerate(last.tolist())]


def _visible_starts(mask: torch.Tensor | None, b: int, nq: int, s: int, row_start: int) -> list[int]:
    """Per query, its first visible KV position: the row's start, or later under a sliding window."""
    if mask is None:
        return [row_start] * nq
    rows = mask[b if mask.shape[0] > 1 else 0, 0]  # (Q, S)
    keep = visible(rows)
    first = keep.to(torch.int32).argmax(-1)  # (Q,): the first True, 0 when none
    return [max(row_start, int(f)) for f in first.tolist()]


def _one_query(qi: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, keep: torch.Tensor | None,
               scale: float, groups: int, softcap: float | None = None,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
    """qi (H, 1, D), kb/vb (KVH, S_i, D) -> (H, D): one query over its visible KV, fp32 inside.

    Fresh contiguous copies, so the library calls see one layout for a given S_i; aten .out
    kernels directly (the shapes already equal the one-token decode's; the mode's row-blocked
    bmm would only add time)."""
    qf = qi.float().contiguous()
    kf = kb.repeat_interleave(groups, dim=0).float().contiguous()
    vf = vb.repeat_interleave(groups, dim=0).float().contiguous()
    scores = aten.bmm.out(qf, kf.transpose(-1, -2), out=torch.empty(0, device=qi.device)) * scale  # (H, 1, S_i)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if keep is not None and keep.dtype == torch.bool:
        scores = scores.masked_fill(~keep, float("-inf"))
    elif keep is not None:
        scores = scores + keep.float()
    if sinks is not None:  # one more column per head, dropped after the softmax
        scores = torch.cat([scores, sinks.float().reshape(-1, 1, 1)], dim=-1)
    probs = aten._softmax.out(scores, -1, False, out=torch.empty(0, device=qi.device))
    if sinks is not None:
        probs = probs[..., :-1].contiguous()
    probs = torch.nan_to_num(probs, nan=0.0)
    return aten.bmm.out(probs, vf, out=torch.empty(0, device=qi.device))[:, 0].to(qi.dtype)  # (H, D)


# Elementwise ops (module docstring). A vectorized loop steps two vectors at a time: 32 fp32 or 64 bf16
# elements on AVX-512, 16 fp32 on AVX2 and on the default build; a buffer of whole 64-element blocks is
# all body on each. Chunks stay below aten's grain size (32768 elements), so one thread computes a call.
CPU_VECTOR_BLOCK = 64
CPU_POINTWISE_CHUNK = 16384

# aten ops whose vector body and scalar tail round differently on this torch's CPU kernels (AVX-512,
# AVX2 or default; measured by tests/test_elementwise_position.py, which fails when an op outside this
# set depends on its position). add and sub only with alpha != 1 in bf16 (the body fuses the multiply-add);
# exp, tanh, erf, log, sqrt, mul, div, addcmul, addcdiv and lerp do not.
POSITION_DEPENDENT = frozenset({"sigmoid", "silu", "gelu", "softplus", "mish", "elu", "pow", "rsqrt", "exp2",
                                "sinh", "cosh", "atan2", "add", "sub"})
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def pointwise(func, *args, **kwargs) -> torch.Tensor:
    """func (a functional aten overload: aten.silu.default, aten.pow.Tensor_Scalar, ...) with every
    element computed inside a vectorized body, whatever its position: the tensor arguments are
    broadcast, flattened and cut into chunks, each padded with zeros to whole CPU_VECTOR_BLOCKs and
    computed by the op's .out overload (never overridden)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    flat = [a.expand(shape).reshape(-1) if isinstance(a, torch.Tensor) else a for a in args]
    out = torch.empty(shape, dtype=dtype, device=tensors[0].device)
    out_flat = out.view(-1)
    op_out = _out_overload(func)
    for start in range(0, out.numel(), CPU_POINTWISE_CHUNK):
        n = min(CPU_POINTWISE_CHUNK, out.numel() - start)
        chunk = [_whole_blocks(a, start, n) if isinstance(a, torch.Tensor) else a for a in flat]
        res = op_out(*chunk, **kwargs, out=torch.empty(0, dtype=dtype, device=out.device))
        out_flat[start:start + n] = res[:n]
    return out


def _whole_blocks(flat: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """flat[start:start + n] in a fresh zeroed buffer of whole CPU_VECTOR_BLOCKs."""
    size = -(-n // CPU_VECTOR_BLOCK) * CPU_VECTOR_BLOCK
    buf = torch.zeros(size, dtype=flat.dtype, device=flat.device)
    buf[:n] = flat[start:start + n]
    return buf


def _out_overload(func):
    """aten.silu.default -> aten.silu.out, aten.pow.Tensor_Scalar -> aten.pow.Tensor_Scalar_out,
    aten.div.Tensor -> aten.div.out (or None)."""
    packet, name = func.overloadpacket, func._overloadname
    return (name != "default" and getattr(packet, f"{name}_out", None)) or getattr(packet, "out", None)


def _functional(func):
    """The functional overload `pointwise` computes for func (an in-place silu_ -> silu), or None."""
    base = func.overloadpacket.__name__
    if base.endswith("_") and func._overloadname == "default":
        base = base[:-1]
        func = getattr(getattr(aten, base, None), "default", None)
    if base not in POSITION_DEPENDENT or func is None or _out_overload(func) is None:
        return None
    return func


def takes(func, args) -> bool:
    """Whether `pointwise` computes this call: a POSITION_DEPENDENT op on non-empty float CPU tensors."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return (bool(tensors) and _functional(func) is not None and all(t.device.type == "cpu" for t in tensors)
            and all(t.dtype in _FLOATS for t in tensors) and all(t.numel() > 0 for t in tensors))


def _whole_vectors(func, args, kwargs):
    """A call `takes` accepts, computed by `pointwise` (in place for silu_ and the like)."""
    result = pointwise(_functional(func), *args, **kwargs)
    return args[0].copy_(result) if func.overloadpacket.__name__.endswith("_") else result


class _WholeVectors(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        return _whole_vectors(func, args, kwargs) if takes(func, args) else func(*args, **kwargs)


def whole_vectors(*inputs):
    """A context in which the POSITION_DEPENDENT ops on CPU tensors go through `pointwise`, so a row's
    elementwise results do not depend on the length of the call. Nothing (a null context) when an input
    is not on the CPU, none is a tensor, or inside torch.compile (a traced graph's elementwise code is
    Inductor's)."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    if torch.compiler.is_compiling() or not tensors or any(t.device.type != "cpu" for t in tensors):
        return contextlib.nullcontext()
    return _WholeVectors()


# The mode's Library entries that would send every CPU call of these ops through `pointwise` (not installed
# by the mode yet: `whole_vectors` covers the routers and experts; a dense MLP's silu over (T, I), with I
# not a multiple of 32, needs these): aten name -> kernel, for overrides.OP_TABLE. Not add and sub: every
# residual add would pay for the few bf16 calls with alpha != 1.
POINTWISE_OPS = ("sigmoid", "sigmoid_", "silu", "silu_", "gelu", "gelu_", "softplus", "mish", "mish_", "elu",
                 "elu_", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "rsqrt", "rsqrt_", "exp2",
                 "exp2_", "sinh", "sinh_", "cosh", "cosh_", "atan2", "atan2_")


def pointwise_takes(name: str):
    """overrides.TAKES' predicate for `name` (one of POINTWISE_OPS): whether pointwise_override's kernel
    computes the call with `pointwise`."""
    base, _, overload = name.partition(".")
    func = getattr(getattr(aten, base), overload or "default")
    return lambda *args, **kwargs: takes(func, args)


def pointwise_override(name: str):
    """An aten kernel for `name` (one of POINTWISE_OPS): `pointwise` where `takes`, else the original kernel
    through the op's .out overload (never overridden; out= the input for an in-place op)."""
    base, _, overload = name.partition(".")
    func = getattr(getattr(aten, base), overload or "default")

    def kernel(*args, **kwargs):
        if takes(func, args):
            return _whole_vectors(func, args, kwargs)
        functional = _functional(func)
        if base.endswith("_"):
            return _out_overload(functional)(*args, **kwargs, out=args[0])
        meta = functional(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return _out_overload(functional)(*args, **kwargs, out=torch.empty(0, dtype=meta.dtype, device=device))

    return kernel
