"""The grouped invariant matmul of a mixture of experts, launched without a host sync.

Rows arrive sorted by expert (grouped.py sorts them on the device). Row r is multiplied by the weight
of its expert: out[r] = x[r] @ W[expert(r)]. Every output element is summed in the matmul's one K order
(triton_matmul.chunk_sums: the same block_k and K chunk as the mode's mm for this dtype and K), so a
row gets the bits the mode's mm gives it in an expert-by-expert loop, whatever else is in the batch.

The loop needs each expert's row count on the host (one launch per expert hit); here the launch grid
is an upper bound known from the shapes alone, ceil(rows / BLOCK_M) + experts blocks of rows, and the
block table (which expert, which rows) is computed on the device. Programs past the last real block
return at once. So a decode step that runs this can be captured in a CUDA graph.
"""

import torch
import triton
import triton.language as tl

from nondet.kernels.config import k_chunk_for, matmul_config
from nondet.kernels.launch import interpreting, launch
from nondet.kernels.triton_matmul import chunk_sums

NUM_WARPS = 4
NUM_STAGES = 4


def tiles(rows: int, experts: int) -> tuple[int, int]:
    """(rows, columns) of one program's tile, from the shapes alone (speed only: every tile sums in the
    same K order). A decode step gives an expert a row or two: 16-row tiles (mma.sync, as the mm's
    M <= 16 bucket), and 64 columns where the few experts hit would leave most SMs idle; a prefill's
    experts get dozens of rows each: 64-row tiles read each weight tile once for all of them."""
    block_m = 64 if rows >= 48 * experts else 16
    block_n = 64 if rows <= 64 else 128
    return block_m, block_n


@triton.jit(do_not_specialize=["R"])
def _grouped_mm_kernel(x_ptr, w_ptr, c_ptr, block_expert_ptr, block_row_ptr, expert_end_ptr,
                       R, N, K, num_experts, s_xm, s_xk, s_we, s_wk, s_wn, s_cm, s_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       K_CHUNK: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                       UPCAST: tl.constexpr):
    """One program: BLOCK_M rows of one expert (block_row .. min(+BLOCK_M, that expert's end)) times
    BLOCK_N columns of its weight. block_expert == num_experts marks a block past the last real one."""
    block = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < num_experts:
        row0 = tl.load(block_row_ptr + block)
        end = tl.load(expert_end_ptr + expert)
        offs_m = row0 + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.where(offs_m < end, offs_m, row0)  # rows past the expert's end recompute row0, never stored
        rn = offs_n % N
        a_base = x_ptr + rm[:, None].to(tl.int64) * s_xm
        b_base = w_ptr + expert.to(tl.int64) * s_we + rn[None, :] * s_wn
        acc = chunk_sums(a_base, b_base, s_xk, s_wk, K, 0, tl.cdiv(K, K_CHUNK), BLOCK_M, BLOCK_N, BLOCK_K,
                         K_CHUNK, EVEN_K, PRECISION, UPCAST)
        c = c_ptr + offs_m[:, None].to(tl.int64) * s_cm + offs_n[None, :] * s_cn
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < end) & (offs_n[None, :] < N))


def block_table(counts: torch.Tensor, rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From each expert's row count (E,) on the device: (block_expert, block_row) of length
    ceil(rows / block_m) + E (the bound on blocks any split of `rows` rows over E experts needs;
    unused blocks get expert E), and each expert's end row (E,). Device ops only, no host sync."""
    num_experts = counts.shape[0]
    counts = counts.to(torch.int64)
    ends = torch.cumsum(counts, 0)
    blocks = (counts + block_m - 1) // block_m
    block_ends = torch.cumsum(blocks, 0)
    index = torch.arange(triton.cdiv(rows, block_m) + num_experts, device=counts.device)
    expert = torch.searchsorted(block_ends, index, right=True)  # E past the last real block
    safe = expert.clamp(max=num_experts - 1)
    row = (ends - counts)[safe] + (index - (block_ends - blocks)[safe]) * block_m
    return expert.to(torch.int32), row.to(torch.int32), ends.to(torch.int32)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor,
               tile: tuple[int, int] | None = None) -> torch.Tensor:
    """x (R, K), rows sorted by expert, counts[e] of them for expert e; weight (E, K, N) (any strides:
    a weight stored (E, N, K) is passed as its transpose view) -> (R, N) in x's dtype. Rows past
    counts.sum() are left unwritten. tile: (rows, columns) per program (tests); None picks by shape."""
    rows, k = x.shape
    num_experts, _, n = weight.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return out
    cfg = matmul_config(x.dtype, 1)  # the dtype's K order (block_k, chunk): every bucket shares it
    block_m, block_n = tile or tiles(rows, num_experts)
    block_expert, block_row, ends = block_table(counts, rows, block_m)
    grid = (block_expert.shape[0], triton.cdiv(n, block_n))
    launch(_grouped_mm_kernel, grid, x)(
        x, weight, out, block_expert, block_row, ends, rows, n, k, num_experts,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), weight.stride(2), out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=cfg.block_k, K_CHUNK=k_chunk_for(k, cfg),
        EVEN_K=(k % cfg.block_k == 0), PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=interpreting(), num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
