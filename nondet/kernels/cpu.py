"""Batch-invariant CPU path: every row is computed by a library call of one fixed shape.

MKL/oneDNN pick their algorithm (GEMV vs GEMM, how K is blocked, how threads split the work)
from the problem shape, so with torch 2.13 F.linear's row 0 differs between M=1 and M>=2. Here
a (M, K) operand is cut into blocks of CPU_ROW_BLOCK rows, each copied into a fresh zeroed
buffer (so the pointer alignment is the allocator's, never an offset into the caller's tensor)
and computed by the ORIGINAL kernel through its `.out` overload, which the mode does not
override, so there is no recursion. Every row meets the same shape, the same code path and the
same thread split wherever it sits in the batch. tests/test_kernels_cpu.py checks, with
torch.equal, every row against the same row computed alone, M = 1..64, fp32 and bf16.

Attention on the CPU runs one batch row at a time, sliced to its real tokens, so each row sees
exactly the shapes it would see alone.
"""

import torch

from nondet.kernels.config import CPU_ROW_BLOCK

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
    rows = x.reshape(-1, x.shape[-1])
    out_dtype = dtype or x.dtype
    out = _rows(rows.shape[0], 1, rows, out_dtype)
    res = _rows(CPU_ROW_BLOCK, 1, rows, out_dtype)
    for start, n in _blocks(rows.shape[0]):
        aten.mean.out(_padded(rows, start, n), [-1], True, dtype=dtype, out=res)
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
              scale: float, kv_start: list[int]) -> torch.Tensor:
    """q (B, H, Q, D), k/v (B, KVH, S, D) -> (B, Q, H, D), one batch row at a time.

    Row b is sliced to KV positions [kv_start[b], S) and to the queries that sit there, so it
    is computed with exactly the shapes of the same request run alone. fp32 inside.
    """
    bsz, h, nq, d = q.shape
    s = k.shape[2]
    g = h // k.shape[1]
    out = torch.zeros((bsz, nq, h, d), dtype=q.dtype, device=q.device)
    for b in range(bsz):
        start = kv_start[b]
        q0 = max(0, start - (s - nq))  # queries before the first real token are padding
        qb = q[b:b + 1, :, q0:].float().contiguous()
        kb = k[b:b + 1, :, start:].repeat_interleave(g, dim=1).float().contiguous()
        vb = v[b:b + 1, :, start:].repeat_interleave(g, dim=1).float().contiguous()
        sb, qn = kb.shape[2], qb.shape[2]
        if mask is None:
            keep = torch.ones((qn, sb), dtype=torch.bool, device=q.device).tril(sb - qn)
        else:
            keep = mask[b if mask.shape[0] > 1 else 0, 0, q0:, start:]
        # aten .out kernels directly: the shapes already equal the solo run's, and the mode's
        # row-blocked bmm would only add time
        scores = aten.bmm.out(qb[0], kb[0].transpose(-1, -2), out=torch.empty(0, device=q.device)) * scale
        if keep.dtype == torch.bool:
            scores = scores.masked_fill(~keep, float("-inf"))
        else:
            scores = scores + keep.float()
        probs = aten._softmax.out(scores, -1, False, out=torch.empty(0, device=q.device))
        probs = torch.nan_to_num(probs, nan=0.0)  # rows with nothing to attend (padding queries)
        ob = aten.bmm.out(probs, vb[0], out=torch.empty(0, device=q.device))  # (H, qn, D)
        out[b, q0:] = ob.transpose(0, 1).to(q.dtype)
    return out
