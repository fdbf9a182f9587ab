"""Public batch-invariant ops: Triton kernels on CUDA, the row-blocked path on the CPU.

These compute the same function as torch's ops but with a reduction order that depends only
on the row, never on the batch. The mode (nondet.kernels.mode) routes aten ops here.
"""

import math
from typing import NamedTuple

import torch

from nondet.kernels import cpu
from nondet.kernels.config import ROW_BLOCK_MAX, SQUARE_EXACT_DTYPES
from nondet.kernels.masks import for_kernel, visible

TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _triton(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype in TRITON_DTYPES


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (K, N)."""
    if _triton(a) and a.dtype == b.dtype:
        from nondet.kernels import triton_matmul

        return triton_matmul.mm(a, b)
    return cpu.mm(a, b)


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta=1, alpha=1) -> torch.Tensor:
    """beta * bias + alpha * (a @ b); bias broadcasts to (M, N)."""
    if _triton(a) and a.dtype == b.dtype:
        from nondet.kernels import triton_matmul

        return triton_matmul.mm(a, b, bias, alpha=float(alpha), beta=float(beta))
    return cpu.addmm(bias, a, b, beta=beta, alpha=alpha)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B, M, K) @ (B, K, N)."""
    if _triton(a) and a.dtype == b.dtype:
        from nondet.kernels import triton_matmul

        return triton_matmul.bmm(a, b)
    return cpu.bmm(a, b)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for inputs of any rank: rows are flattened first."""
    rows = x.reshape(-1, x.shape[-1])
    out = mm(rows, weight.t()) if bias is None else addmm(bias, rows, weight.t())
    return out.reshape(*x.shape[:-1], weight.shape[0])


def mean_last(x: torch.Tensor, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x.mean(-1, keepdim=keepdim, dtype=dtype)."""
    if _triton(x):
        from nondet.kernels import triton_rows

        return triton_rows.mean_last(x, keepdim, dtype)
    return cpu.mean_last(x, keepdim, dtype)


def sum_last(x: torch.Tensor, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x.sum(-1, keepdim=keepdim, dtype=dtype): a router's top-k weight sum, a norm written as a sum."""
    if _triton(x):
        from nondet.kernels import triton_rows

        return triton_rows.sum_last(x, keepdim, dtype)
    return cpu.row_blocked_reduce(torch.ops.aten.sum.IntList_out, x, keepdim, dtype)


def mean_sq(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """x.float().pow(2).mean(-1, keepdim) in fp32, with the bits of mean_last over the stored squares.
    On CUDA the squares of bf16 / fp16 rows up to ROW_BLOCK_MAX are never written (triton_rows.mean_sq)."""
    if _triton(x) and x.shape[-1] <= ROW_BLOCK_MAX and x.dtype in SQUARE_EXACT_DTYPES:
        from nondet.kernels import triton_rows

        return triton_rows.mean_sq(x, keepdim)
    return mean_last(x.float().pow(2), keepdim)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight, fp32 inside, x's dtype out."""
    if _triton(x):
        from nondet.kernels import triton_rows

        return triton_rows.rms_norm(x, weight, eps)
    xf = x.float()
    y = xf * torch.rsqrt(cpu.mean_last(xf * xf, True, None) + eps)
    return (y if weight is None else y * weight.float()).to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim."""
    if _triton(x):
        from nondet.kernels import triton_rows

        return triton_rows.layer_norm(x, weight, bias, eps)[0]
    return cpu.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)[0]


def softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax over the last dim."""
    if _triton(x):
        from nondet.kernels import triton_rows

        return triton_rows.softmax(x, log=False, dtype=dtype)
    return cpu.softmax_last(x if dtype is None else x.to(dtype), False, log=False)


def log_softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """log_softmax over the last dim."""
    if _triton(x):
        from nondet.kernels import triton_rows

        return triton_rows.softmax(x, log=True, dtype=dtype)
    return cpu.softmax_last(x if dtype is None else x.to(dtype), False, log=True)


def kv_start_from_mask(mask: torch.Tensor | None, bsz: int, s: int, device) -> torch.Tensor:
    """Per batch row, the number of leading KV positions no query may see (left padding)."""
    if mask is None:
        return torch.zeros(bsz, dtype=torch.int32, device=device)
    keep = visible(mask)
    seen = keep[:, 0].any(dim=1)  # (B or 1, S): columns some query sees
    # the first seen column (the width where none is): one reduction, where a running product of the hidden
    # columns was a scan kernel and a reduction. int64 positions, narrowed after: as in query_end, an int32
    # arange in a looped reduction failed Triton's compile on CUDA (H200, torch 2.11)
    width = seen.shape[-1]
    positions = torch.arange(width, dtype=torch.int64, device=device)
    lead = torch.where(seen, positions, width).amin(-1).to(torch.int32)
    return lead.expand(bsz).contiguous()


def first_visible(mask: torch.Tensor, bsz: int, device) -> torch.Tensor:
    """(B, Q) int32: each query's first visible KV position (0 when it sees nothing). On the device."""
    keep = visible(mask)
    return keep[:, 0].to(torch.int32).argmax(-1).to(torch.int32).expand(bsz, -1)


def query_end(mask: torch.Tensor, bsz: int, device) -> torch.Tensor:
    """(B, Q) int32: one past each query's last visible KV position (0 when it sees nothing). On the
    device: the kernel stops there, since later positions would only add exact zeros."""
    keep = visible(mask)
    # int64, narrowed after the max: with the key length symbolic, Inductor (torch 2.11) indexes an arange fused
    # into the reduction in int64 whatever its dtype, so an int32 running max failed Triton's compile
    # ("Loop-carried variable ... int32 ... re-assigned to int64") and the mode's saved step with it
    ends = torch.arange(1, keep.shape[-1] + 1, dtype=torch.int64, device=device)
    return (keep[:, 0].to(torch.int64) * ends).amax(-1).to(torch.int32).expand(bsz, -1)


def run_start(mask: torch.Tensor, ends: torch.Tensor, bsz: int) -> torch.Tensor:
    """(B, Q) int32: where each query's visible keys are one run [first, ends) (ends: query_end; in a float mask,
    all of value 0), its first position, else -1. On the device. The kernel tests a row given as a run by
    position, as it does a causal row, instead of loading its mask: transformers' causal, padded,
    sliding-window and static-cache masks are all runs; a tree or block-sparse mask is not."""
    keep = visible(mask)  # (B or 1, 1, Q, S)
    first = first_visible(keep, bsz, mask.device)
    keep = keep[:, 0]
    runs = keep.sum(-1, dtype=torch.int32) == ends - first  # a row that sees nothing is an empty run
    if mask.dtype != torch.bool:  # an additive mask must add exactly 0 where it lets a query see and hide the
        # rest (a NaN does neither: its row keeps the mask, which carries the NaN into the output as before)
        plain = (mask[:, 0] == 0) | (mask[:, 0] < torch.finfo(mask.dtype).min / 2)
        runs = runs & plain.all(-1)
    return torch.where(runs, first, -1).to(torch.int32).expand(bsz, -1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None, is_causal: bool = True, softcap: float | None = None,
              sinks: torch.Tensor | None = None, sliding: bool = False) -> torch.Tensor:
    """q (B, H, Q, D), k (B, KVH, S, D), v (B, KVH, S, Dv) -> (B, Q, H, Dv).

    mask: None (causal when is_causal, query i at KV position S - Q + i; else full), or a bool
    (True = attend) / additive float mask broadcastable to (B, 1, Q, S). Prefill and decode use
    the same per-row arithmetic; left padding is aligned away (see triton_attention).
    softcap: scores -> softcap * tanh(scores / softcap) before the mask (Gemma 2). sinks (H,): a
    per-head logit in the softmax denominator with no value (gpt-oss attention sinks). sliding: the
    mask holds a sliding window, so each query starts at its own first visible position (the CPU
    path always does).
    Forward only: a training forward goes through autograd.attention (same bits, a backward).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    keys = attention_inputs(q, k, mask, is_causal, sliding)
    if _triton(q):
        from nondet.kernels import triton_attention

        return triton_attention.attention(q, k, v, keys.mask, scale, keys.kv_start, softcap=softcap, sinks=sinks,
                                          query_start=keys.query_start, query_end=keys.query_end,
                                          run_start=keys.run_start)
    return cpu.attention(q, k, v, keys.mask, scale, keys.kv_start.tolist(), softcap=softcap, sinks=sinks)


# Benchmark switch: False gives the kernel no runs, so every masked tile loads its mask (the A / B of
# scripts/bench_probe.py --no-mask-runs); the bits are the same either way.
MASK_RUNS = True


class KeyRanges(NamedTuple):
    """What the kernels read about the keys each query may see (attention_inputs)."""
    mask: torch.Tensor | None  # cut to the keys; on the Triton path as the kernel loads it (masks.for_kernel)
    kv_start: torch.Tensor  # (B,) leading positions no query sees (left padding): the chunks start there
    query_start: torch.Tensor | None  # (B, Q) a sliding window's first visible position: the query's own chunks
    query_end: torch.Tensor | None  # (B, Q) one past the last visible position (with a mask, Triton path)
    run_start: torch.Tensor | None  # (B, Q) a run's first position, -1 for a row that is not a run (same)


def _cut(mask: torch.Tensor, s: int) -> torch.Tensor:
    """The mask's first s keys. In a trace, copied to a buffer of its own in the standard layout: the cut in place
    has a batch stride of the whole mask's length, and Inductor's lowering of the reductions over it (torch 2.11)
    guarded on the batch being 1 or not, so a saved step traced at batch 1 refused batch 2 and one traced at 2
    refused 1 ("2 <= mask.size()[0]"): each kernels mode compiled two functions (on an H200, and on a CPU with
    Inductor). A clone's strides follow from its sizes alone (`.contiguous()` asks whether a copy is needed, a
    question on the batch again). Eager reads the cut in place: no copy per layer."""
    cut = mask[..., :s]
    return cut.clone(memory_format=torch.contiguous_format) if torch.compiler.is_compiling() else cut


def attention_inputs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
                     sliding: bool) -> KeyRanges:
    """The mask and its index arithmetic for the kernels: no reduction over values. A compiled graph
    computes it as plain ops (Inductor fuses them) and passes it to the opaque attention kernel
    (custom_ops)."""
    bsz, _, nq, _ = q.shape
    s = k.shape[2]
    if mask is None and not is_causal:
        mask = torch.ones((1, 1, nq, s), dtype=torch.bool, device=q.device)
    if mask is not None:
        # the mask covers at least the keys (a static cache's mask is as long as the cache): said to the tracer,
        # the cut has the keys' length s; unsaid, its length was Min(s, mask's), a size Inductor computes in the
        # graph, and on CUDA (torch 2.11) the saved step's CUDA-graph partition lost the buffer holding it
        # (NameError at the first call: the step ran the JIT compile). In eager a plain assertion. No message:
        # dynamo cannot trace one built from shapes, and refused the whole trace (the JIT compile, 40 graph breaks)
        torch._check(s <= mask.shape[-1])
        mask = _cut(mask, s)
    # what the mask lets each query see, found once (a float mask's comparison is a pass over the mask);
    # the helpers below take it as a bool mask
    keep = None if mask is None else visible(mask)
    kv_start = kv_start_from_mask(keep, bsz, s, q.device)
    if not (_triton(q) and mask is not None):  # the rest only the Triton kernel reads (the CPU path finds
        return KeyRanges(mask, kv_start, None, None, None)  # each query's visible range on the host)
    query_start = first_visible(keep, bsz, q.device) if sliding else None
    ends = query_end(keep, bsz, q.device)
    runs = run_start(mask, ends, bsz) if MASK_RUNS else None
    # the mask as the kernel loads it, converted here: in a graph Inductor fuses the copy with the index
    # arithmetic above instead of the opaque kernel launching one per layer
    return KeyRanges(for_kernel(mask), kv_start, query_start, ends, runs)
