"""Batch-invariant attention in Triton: prefill (causal, GQA, masks) and decode on a KV cache.

A query row's arithmetic is fixed by its own position, never by the batch or by how many
queries share the launch:

- the KV range [kv_start, S) is cut into chunks of a FIXED size (`kv_chunk`, 512 for bf16 / fp16), never into
  a fixed number of splits; a chunk is summed with an online softmax in steps of `block_n`;
- chunk results (max, sum, acc) are merged in chunk order by one shared `merge` helper (triton_attention_merge);
- prefill runs one program per row tile that merges as it goes (fused). Decode (few rows: the
  row tiles alone leave the GPU idle) runs one program per (row tile, chunk) in the same launch
  (split): each writes its chunk's (max, sum, acc) to a workspace, and the last of a tile's
  programs to finish (an atomic counter per tile) merges the tile's chunks in chunk order,
  exactly as the fused loop does. Arrival order picks which program merges, never the order of
  the merges. The arithmetic is the same, so a token's logprob from decode equals the one from a
  fresh prefill of the same sequence.

Positions a row may not see (causal, mask, beyond S) contribute exact zeros, so extra masked
steps never change a row's bits. `kv_start` (per batch row: the number of left-padding
positions) aligns the chunks to the first real token, which makes left padding invariant too.
"""

import math

import torch
import triton
import triton.language as tl

from nondet.kernels.config import (ATTENTION_CONFIGS, FEW_DECODE_PROGRAMS, LONG_CACHE, AttentionConfig, attention_config,
                                  sm_count)
from nondet.kernels.launch import interpreting, launch
from nondet.kernels.masks import KERNEL_MASK_DTYPE, for_kernel
from nondet.kernels.triton_attention_merge import NEG, arrived_last, merge, merge_stored, store_chunk, workspace

_LOG2E = 1.4426950408889634


@triton.jit
def _tanh(x):
    """tanh from exp, exact at the saturated ends (exp overflow gives +-1), on every backend."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _chunk(q, k_base, v_base, mask_base, s_ks, s_kd, s_vs, s_vd, s_mq, s_ms,
           qi, qpos, row_ok, run_lo, run_hi, offs_d, offs_dv, lo, hi, qk_scale, cap_in, cap_out,
           D, DV, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
           CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PRECISION: tl.constexpr,
           UPCAST: tl.constexpr, SOFTCAP: tl.constexpr):
    """Online softmax over KV positions [lo, hi) for a tile of query rows -> (max, sum, acc).

    Scores are in log2 units (qk_scale = scale * log2 e). With SOFTCAP they are
    cap * tanh(q.k * scale / cap) first: cap_in = scale / cap, cap_out = cap * log2 e.
    MASK_KIND: 0 none (causal or full), 1 a bool mask, 2 an additive mask, 3 the mask's rows as runs of
    keys [run_lo, run_hi) (BLOCK_M,): the same visible set as kinds 1 / 2 give those rows, tested by
    position (an additive mask's run adds exactly 0 and hides the rest, whose p is an exact 0 either way)."""
    m = tl.full((BLOCK_M,), NEG, dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        kt = tl.load(k_base + cols[None, :] * s_ks + offs_d[:, None] * s_kd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_base + cols[:, None] * s_vs + offs_dv[None, :] * s_vd,
                    mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        if UPCAST:  # the CPU interpreter's tl.dot misreads bf16/fp16
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        if SOFTCAP:
            s = _tanh(tl.dot(q, kt, input_precision=PRECISION) * cap_in) * cap_out
        else:
            s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        ok = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            ok = ok & (cols[None, :] <= qpos[:, None])
        if MASK_KIND == 1:
            mk = tl.load(mask_base + qi[:, None] * s_mq + cols[None, :] * s_ms, mask=ok, other=0)
            ok = ok & (mk != 0)
        if MASK_KIND == 2:
            mk = tl.load(mask_base + qi[:, None] * s_mq + cols[None, :] * s_ms, mask=ok, other=0.0)
            s = s + mk.to(tl.float32) * 1.4426950408889634
        if MASK_KIND == 3:
            ok = ok & (cols[None, :] >= run_lo[:, None]) & (cols[None, :] < run_hi[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # a max is exact in any order
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None]).to(v_base.dtype.element_ty)
        if UPCAST:
            p = p.to(tl.float32)
        l = tl.fma(l, alpha, _row_sum(p, BLOCK_N, PRECISION))
        acc = acc * alpha[:, None]
        acc = tl.dot(p, v, acc, input_precision=PRECISION)
        m = m_new
    return m, l, acc


@triton.jit
def _row_sum(p, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Sum of each row of p (BLOCK_M, BLOCK_N) -> (BLOCK_M,), in an order no compiler pass can move.

    tl.sum's order follows the layout the compiler gives p, and that layout depends on what
    else the binary does: with a mask to load, Triton 3.6 converted p from the MMA layout to
    a blocked one before the sum, so a row's softmax denominator differed by 1 ULP between a
    masked launch and a causal one (H100, gpu_attn_rows.py of commit f708220). A dot's operand layouts
    are fixed by the MMA, so the row sum is taken as p @ ones: every column holds the same
    sum, and a max picks one exactly. Summing the same rounded p the PV product uses also
    keeps numerator and denominator consistent.
    """
    ones = tl.full((BLOCK_N, 16), 1.0, dtype=p.dtype)
    return tl.max(tl.dot(p, ones, input_precision=PRECISION), axis=1)


@triton.jit(do_not_specialize=["Q", "S"])  # one binary for every batch size
def _attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, start_ptr, end_ptr, run_ptr, sink_ptr, ws_m, ws_l, ws_acc,
                 count_ptr,
                 Q, S, H, KVH, D, DV, NC, qk_scale, cap_in, cap_out,
                 s_qb, s_qh, s_qq, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
                 s_mb, s_mq, s_ms,
                 G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, SPLIT: tl.constexpr,
                 CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
                 ONE_QUERY: tl.constexpr, HAS_END: tl.constexpr, HAS_RUNS: tl.constexpr,
                 MERGE_BLOCK: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // KVH).to(tl.int64)
    kvh = pid_bh % KVH
    if ONE_QUERY:  # a tile holds the G heads of one query: its chunks start at that query's own start
        rows = pid_r * G + tl.arange(0, BLOCK_M)
        row_ok = tl.arange(0, BLOCK_M) < G
    else:
        rows = pid_r * BLOCK_M + tl.arange(0, BLOCK_M)  # row = query index * G + head in group
        row_ok = rows < Q * G
    qi = rows // G
    head = kvh * G + rows % G
    qpos = S - Q + qi  # query position in KV coordinates (bottom-right causal alignment)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + b * s_qb + head[:, None] * s_qh + qi[:, None] * s_qq + offs_d[None, :] * s_qd,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + b * s_kb + kvh * s_kh
    v_base = v_ptr + b * s_vb + kvh * s_vh
    mask_base = mask_ptr + b * s_mb
    # kv_start comes from device memory, so it is clamped to [0, S] here: a value outside (an
    # unwritten buffer, a caller's bug) must never address outside K/V (an illegal memory access)
    # ONE_QUERY: one start per (row, query), a sliding window's first visible position
    start = tl.minimum(tl.maximum(tl.load(start_ptr + (b * Q + pid_r if ONE_QUERY else b)), 0), S)
    # last KV position any row of this tile may see
    last = S - 1
    if CAUSAL:
        if ONE_QUERY:
            last = S - Q + pid_r
        else:
            last = tl.minimum(S - Q + (pid_r * BLOCK_M + BLOCK_M - 1) // G, S - 1)
    run_lo = qi  # placeholders where rows are not given as runs (never read then)
    run_hi = qi
    if HAS_END:  # a mask: past its rows' last visible position a tile would only add exact zeros
        run_hi = tl.load(end_ptr + b * Q + qi, mask=row_ok, other=0)
        tile_end = tl.max(run_hi)
        last = tl.minimum(last, tl.minimum(tl.maximum(tile_end, 0), S) - 1)  # clamped like kv_start
    # the tile's chunks: the fused loop computes and merges these, the split merge reads the same
    # values back, so both merge the same (max, sum, acc) in the same order. A row that ends earlier
    # than the tile's last row gets (NEG, 0, 0) from its later chunks, which leaves it unchanged.
    n_chunks = tl.cdiv(last + 1 - start, CHUNK)
    if SPLIT:
        c_lo = tl.program_id(2)
        c_hi = c_lo + 1
    else:
        c_lo = 0
        c_hi = n_chunks
    tile_runs = False
    if HAS_RUNS:  # every row of the tile a run: its keys tested by position, no mask loaded (speed only)
        run_lo = tl.load(run_ptr + b * Q + qi, mask=row_ok, other=0)
        tile_runs = tl.min(run_lo) >= 0
    if tile_runs:
        m, l, acc = _tile_chunks(q, k_base, v_base, mask_base, s_ks, s_kd, s_vs, s_vd, s_mq, s_ms, qi, qpos, row_ok,
                                 run_lo, run_hi, offs_d, offs_dv, start, last, c_lo, c_hi, qk_scale, cap_in, cap_out,
                                 D, DV, BLOCK_M, BLOCK_N, BLOCK_DV, CHUNK, SPLIT, CAUSAL, 3, PRECISION, UPCAST,
                                 SOFTCAP)
    else:
        m, l, acc = _tile_chunks(q, k_base, v_base, mask_base, s_ks, s_kd, s_vs, s_vd, s_mq, s_ms, qi, qpos, row_ok,
                                 run_lo, run_hi, offs_d, offs_dv, start, last, c_lo, c_hi, qk_scale, cap_in, cap_out,
                                 D, DV, BLOCK_M, BLOCK_N, BLOCK_DV, CHUNK, SPLIT, CAUSAL, MASK_KIND, PRECISION,
                                 UPCAST, SOFTCAP)
    if SPLIT:
        ws_row = ((b * H + head) * Q + qi) * NC  # (B, H, Q, NC) layout of the workspace: chunk 0 of each row
        store_chunk(ws_m, ws_l, ws_acc, ws_row + c_lo, m, l, acc, row_ok, offs_dv, BLOCK_DV)
        if arrived_last(count_ptr):
            m, l, acc = merge_stored(ws_m, ws_l, ws_acc, ws_row, n_chunks, row_ok, offs_dv, BLOCK_M, BLOCK_DV,
                                      MERGE_BLOCK)
            _store_out(o_ptr, sink_ptr, m, l, acc, b, qi, head, row_ok, offs_dv, Q, H, DV, SINKS)
    else:
        _store_out(o_ptr, sink_ptr, m, l, acc, b, qi, head, row_ok, offs_dv, Q, H, DV, SINKS)


@triton.jit
def _tile_chunks(q, k_base, v_base, mask_base, s_ks, s_kd, s_vs, s_vd, s_mq, s_ms, qi, qpos, row_ok, run_lo, run_hi,
                 offs_d, offs_dv, start, last, c_lo, c_hi, qk_scale, cap_in, cap_out, D, DV,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr,
                 SPLIT: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, SOFTCAP: tl.constexpr):
    """The tile's chunks c_lo..c_hi-1 of CHUNK keys from `start`, merged in order (fused), or the one chunk
    of a split program: (max, sum, acc) of the tile's rows."""
    m = tl.full((BLOCK_M,), NEG, dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    for c in range(c_lo, c_hi):
        lo = start + c * CHUNK
        hi = tl.minimum(lo + CHUNK, last + 1)
        m_c, l_c, acc_c = _chunk(q, k_base, v_base, mask_base, s_ks, s_kd, s_vs, s_vd, s_mq, s_ms,
                                 qi, qpos, row_ok, run_lo, run_hi, offs_d, offs_dv, lo, hi, qk_scale, cap_in, cap_out,
                                 D, DV, BLOCK_M, BLOCK_N, BLOCK_DV, CAUSAL, MASK_KIND, PRECISION, UPCAST, SOFTCAP)
        if SPLIT:
            m, l, acc = m_c, l_c, acc_c
        else:
            m, l, acc = merge(m, l, acc, m_c, l_c, acc_c)
    return m, l, acc


@triton.jit
def _store_out(o_ptr, sink_ptr, m, l, acc, b, qi, head, row_ok, offs_dv, Q, H, DV, SINKS: tl.constexpr):
    """The merged rows -> o (B, Q, H, DV): the sink joins the denominator, a row that saw no key is 0."""
    if SINKS:
        l = _with_sink(l, m, sink_ptr, head, row_ok)
    out = tl.where(l[:, None] > 0, acc / tl.where(l > 0, l, 1.0)[:, None], 0.0)
    o = o_ptr + ((b * Q + qi[:, None]) * H + head[:, None]) * DV + offs_dv[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _with_sink(l, m, sink_ptr, head, row_ok):
    """The softmax denominator with the head's sink logit (log2 units) added once, after every chunk
    is merged: one fixed point of the arithmetic for decode, prefill and split-KV alike."""
    sink = tl.load(sink_ptr + head, mask=row_ok, other=0.0)
    return l + tl.exp2(sink - m)


def use_split(programs: int, chunks: int, device: torch.device) -> bool:
    """One program per chunk when the row tiles alone leave the GPU idle. Speed only."""
    return chunks > 1 and programs < 2 * sm_count(device)


def few_decode_programs(dtype: torch.dtype, bsz: int, nq: int, kvh: int, s: int) -> bool:
    """A one-query decode whose chunk programs (batch x KV heads x chunks of S keys) are fewer than
    config.FEW_DECODE_PROGRAMS: it takes the deeper pipeline (speed only)."""
    return nq == 1 and bsz * kvh * triton.cdiv(s, ATTENTION_CONFIGS[dtype].kv_chunk) < FEW_DECODE_PROGRAMS


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None, kv_start: torch.Tensor | None = None,
              split: bool | None = None, cfg: AttentionConfig | None = None,
              softcap: float | None = None, sinks: torch.Tensor | None = None,
              query_start: torch.Tensor | None = None, query_end: torch.Tensor | None = None,
              run_start: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for q (B, H, Q, D) over k (B, KVH, S, D), v (B, KVH, S, Dv) -> (B, Q, H, Dv).

    mask: None (causal, bottom-right aligned: query i sits at position S - Q + i), a bool mask
    (True = attend) or an additive float mask, broadcastable to (B, 1, Q, S). kv_start: (B,)
    first KV position of each row (left padding); chunks start there. Values outside [0, S] are
    clamped to it on the device (a row starting at S sees nothing and gets zeros).
    softcap: scores -> softcap * tanh(scores / softcap) before the mask. sinks (H,): a per-head
    logit added to the softmax denominator once, after all chunks are merged. query_start (B, Q):
    each query's own first visible position (a sliding window): then a tile holds one query and its
    chunks start there, so a windowed query's bits do not depend on the other queries of the call.
    query_end (B, Q), with a mask: one past each query's last visible position (ops.query_end); a tile
    stops at its rows' last one, which skips only masked positions (exact zeros): speed, never bits.
    run_start (B, Q), with query_end: where a query's visible keys are the run [run_start, query_end),
    else -1 (ops.run_start); a tile whose rows are all runs tests positions instead of loading the mask,
    the same visible set: speed, never bits.
    """
    bsz, h, nq, d = q.shape
    kvh, s, dv = k.shape[1], k.shape[2], v.shape[3]
    assert h % kvh == 0 and v.shape[:3] == k.shape[:3] and k.shape[0] == bsz
    g = h // kvh
    out = torch.empty((bsz, nq, h, dv), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if kv_start is None:
        kv_start = torch.zeros(bsz, dtype=torch.int32, device=q.device)
    one_query = query_start is not None
    # the tile: longer launches take larger row tiles (speed only: a row's bits do not depend on it);
    # a one-query tile holds one query's G heads, so it keeps the decode tile
    has_end = query_end is not None and mask is not None
    has_runs = has_end and run_start is not None
    cfg = cfg or attention_config(q.dtype, 1 if one_query else nq * g, by_position=mask is None or has_runs,
                                  head_dim=max(d, dv), long_cache=s >= LONG_CACHE,
                                  few_programs=few_decode_programs(q.dtype, bsz, nq, kvh, s))
    if one_query:
        assert g <= cfg.block_m, "a tile must hold a query's heads"
        kv_start = query_start.expand(bsz, nq)
    kv_start = kv_start.to(device=q.device, dtype=torch.int32).contiguous()
    end_t = _per_query(query_end, q) if has_end else kv_start
    run_t = _per_query(run_start, q) if has_runs else kv_start
    mask_kind, mask_t, mstrides = _mask_args(mask, bsz, nq, s, q)
    block_d, block_dv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    chunks = triton.cdiv(s, cfg.kv_chunk)
    row_tiles = nq if one_query else triton.cdiv(nq * g, cfg.block_m)
    if split is None:
        split = use_split(row_tiles * bsz * kvh, chunks, q.device)
    nc = chunks if split else 1
    ws_m, ws_l, ws_acc, counts = workspace(out, nq, nc, block_dv, row_tiles * bsz * kvh) if split else (out,) * 4
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    cap_in, cap_out = (float(scale) / softcap, softcap * _LOG2E) if softcap else (0.0, 0.0)
    # sinks in log2 units, fp32, one per head; the output tensor stands in when there are none
    sink_t = out if sinks is None else (sinks.to(device=q.device, dtype=torch.float32) * _LOG2E).contiguous()
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    launch(_attn_kernel, (row_tiles, bsz * kvh, nc), out)(
        q, k, v, out, mask_t, kv_start, end_t, run_t, sink_t, ws_m, ws_l, ws_acc, counts,
        nq, s, h, kvh, d, dv, nc, float(scale) * _LOG2E, cap_in, cap_out,
        *q.stride(), *k.stride(), *v.stride(), *mstrides,
        G=g, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=cfg.kv_chunk,
        SPLIT=split, CAUSAL=mask_kind == 0, MASK_KIND=mask_kind, PRECISION=precision,
        UPCAST=interpreting(), SOFTCAP=bool(softcap), SINKS=sinks is not None, ONE_QUERY=one_query,
        HAS_END=has_end, HAS_RUNS=has_runs, MERGE_BLOCK=cfg.merge_block,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def _per_query(t: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A (B or 1, Q) index tensor as the kernel reads it: (B, Q) int32, dense, on q's device."""
    return t.expand(q.shape[0], q.shape[2]).to(device=q.device, dtype=torch.int32).contiguous()


def _mask_args(mask, bsz, nq, s, like):
    """(kind, tensor, (stride_b, stride_q, stride_s)) for the kernel; kind 0 = causal, no tensor."""
    if mask is None:
        return 0, like, (0, 0, 0)
    assert mask.dim() == 4 and mask.shape[1] == 1, "mask must be (B or 1, 1, Q, S)"
    # a bool mask (or one ops already converted: KERNEL_MASK_DTYPE, nonzero = attend) is loaded as int16,
    # not as the bool's own bytes: Triton sizes the p @ V operand layout (kWidth) from the narrowest type
    # that feeds p, and an 8-bit mask gave kWidth 4 where the causal binary has 2, a different K order
    # inside the MMA and 1-ULP differences between a masked call (a verification chunk, a padded batch)
    # and a causal one (H100; tests/test_kernels_ttgir.py). Converted before the expand, so a mask shared
    # by the batch is not copied per row.
    kind = 1 if mask.dtype in (torch.bool, KERNEL_MASK_DTYPE) else 2
    m = for_kernel(mask).expand(bsz, 1, nq, s)
    return kind, m, (m.stride(0), m.stride(2), m.stride(3))
