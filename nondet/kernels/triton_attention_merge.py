"""Attention's chunk merge: folding one KV chunk's (max, sum, acc) into a row's running state, and the
split launch's workspace, where each chunk program stores its chunk and the last to arrive merges the
tile's chunks in chunk order (triton_attention explains why the order, never the arrival, decides).
"""

import torch
import triton
import triton.language as tl

from nondet.kernels import counters

NEG = tl.constexpr(-1.0e30)  # finite "minus infinity" for running maxima: exp2(NEG - m) is an exact 0


@triton.jit
def merge(m, l, acc, m_c, l_c, acc_c):
    """Fold one chunk's (max, sum, acc) into the running one; explicit fma pins the rounding."""
    m_new = tl.maximum(m, m_c)
    a = tl.exp2(m - m_new)
    b = tl.exp2(m_c - m_new)
    l = tl.fma(l_c, b, l * a)
    acc = tl.fma(acc_c, b[:, None], acc * a[:, None])
    return m_new, l, acc


@triton.jit
def store_chunk(ws_m, ws_l, ws_acc, idx, m, l, acc, row_ok, offs_dv, BLOCK_DV: tl.constexpr):
    """One chunk's (max, sum, acc) of the tile's rows into the workspace at row indices idx (BLOCK_M,)."""
    tl.store(ws_m + idx, m, mask=row_ok)
    tl.store(ws_l + idx, l, mask=row_ok)
    tl.store(ws_acc + idx[:, None] * BLOCK_DV + offs_dv[None, :], acc, mask=row_ok[:, None])


@triton.jit
def arrived_last(count_ptr):
    """Whether this program is the last of its row tile's chunk programs to finish. Counters: one int32
    per (batch x kv head, row tile), zero at the start; the last program stores the zero back
    (counters.py). acq_rel: this program's workspace stores are released before the count, and the
    last program acquires every other program's."""
    tl.debug_barrier()  # every thread's part of the chunk is written before the release below
    counter = count_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    last = arrived == tl.num_programs(2) - 1
    if last:  # every program has counted: zero again for the next launch
        tl.store(counter, 0)
    return last


@triton.jit
def merge_stored(ws_m, ws_l, ws_acc, ws_row, n_chunks, row_ok, offs_dv,
                  BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, MERGE_BLOCK: tl.constexpr):
    """Chunks 0..n_chunks-1 of the tile's rows (workspace rows ws_row, (BLOCK_M,)) merged in chunk order
    from the empty state: the fused loop's merges, on the same chunk values. .cg loads read L2, where
    the other programs' stores are (L1 is per SM and not coherent). MERGE_BLOCK 4 loads four chunks per
    round trip and merges them one by one (no merge past n_chunks): the same merges, fewer waits."""
    m = tl.full((BLOCK_M,), NEG, dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    if MERGE_BLOCK == 1:
        for c in range(0, n_chunks):
            idx = ws_row + c
            m_c = tl.load(ws_m + idx, mask=row_ok, other=NEG, cache_modifier=".cg")
            l_c = tl.load(ws_l + idx, mask=row_ok, other=0.0, cache_modifier=".cg")
            acc_c = tl.load(ws_acc + idx[:, None] * BLOCK_DV + offs_dv[None, :], mask=row_ok[:, None], other=0.0,
                            cache_modifier=".cg")
            m, l, acc = merge(m, l, acc, m_c, l_c, acc_c)
    else:
        tl.static_assert(MERGE_BLOCK == 4)
        j = tl.arange(0, 4)
        for c0 in range(0, n_chunks, 4):
            idx = ws_row[:, None] + c0 + j[None, :]  # (BLOCK_M, 4): a row's four chunks are adjacent
            ok = row_ok[:, None] & (c0 + j[None, :] < n_chunks)
            m4 = tl.load(ws_m + idx, mask=ok, other=NEG, cache_modifier=".cg")
            l4 = tl.load(ws_l + idx, mask=ok, other=0.0, cache_modifier=".cg")
            acc4 = tl.load(ws_acc + idx[:, None, :] * BLOCK_DV + offs_dv[None, :, None], mask=ok[:, None, :],
                           other=0.0, cache_modifier=".cg")  # (BLOCK_M, BLOCK_DV, 4)
            m0, m1, m2, m3 = _quarters(tl.reshape(m4, (BLOCK_M, 2, 2)))
            l0, l1, l2, l3 = _quarters(tl.reshape(l4, (BLOCK_M, 2, 2)))
            a0, a1, a2, a3 = _quarters(tl.reshape(acc4, (BLOCK_M, BLOCK_DV, 2, 2)))
            m, l, acc = merge(m, l, acc, m0, l0, a0)  # c0 < n_chunks
            if c0 + 1 < n_chunks:
                m, l, acc = merge(m, l, acc, m1, l1, a1)
            if c0 + 2 < n_chunks:
                m, l, acc = merge(m, l, acc, m2, l2, a2)
            if c0 + 3 < n_chunks:
                m, l, acc = merge(m, l, acc, m3, l3, a3)
    return m, l, acc


@triton.jit
def _quarters(x):
    """x (..., 2, 2), the last axis of four reshaped (j = 2 * high + low) -> slices j = 0, 1, 2, 3 (moves only)."""
    even, odd = tl.split(x)  # low 0 / 1: (..., 2) over high
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


def workspace(out, nq, nc, block_dv, tiles):
    """The split launch's fp32 workspace, (m, l) (B, H, Q, NC) and acc (B, H, Q, NC, BLOCK_DV), and
    its arrival counters (tiles,) int32, zero, which the launch leaves at zero (counters.py)."""
    bsz, h = out.shape[0], out.shape[2]
    ws_m = torch.empty((bsz, h, nq, nc), dtype=torch.float32, device=out.device)
    ws_acc = torch.empty((bsz, h, nq, nc, block_dv), dtype=torch.float32, device=out.device)
    return ws_m, torch.empty_like(ws_m), ws_acc, counters.zeroed(tiles, out)
