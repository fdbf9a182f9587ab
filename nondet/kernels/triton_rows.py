"""Row kernels in Triton: RMSNorm, LayerNorm, mean over the last dim (of a row or of its squares),
softmax, log_softmax.

One program owns one row, so a row's reduction tree depends only on the row length (the block
size is fixed by N), never on how many rows are in the launch. Rows longer than ROW_BLOCK_MAX
are walked in blocks of ROW_BLOCK_MAX, in order. All arithmetic is fp32.
"""

import torch
import triton
import triton.language as tl

from nondet.kernels import bound
from nondet.kernels.config import ROW_BLOCK_MAX, SQUARE_EXACT_DTYPES
from nondet.kernels.launch import aligned16, launch


def _block(n: int) -> tuple[int, int]:
    """(block size, num_warps) for rows of n columns: depends on n alone."""
    block = min(triton.next_power_of_2(max(n, 1)), ROW_BLOCK_MAX)
    return block, max(1, min(16, block // 512))


@triton.jit
def _row_sum(x_ptr, N, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + start + offs, mask=start + offs < N, other=0.0).to(tl.float32)
        acc += x * x if SQUARE else x
    return tl.sum(acc, axis=0)


@triton.jit
def _mean_kernel(x_ptr, y_ptr, N, s_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    total = _row_sum(x_ptr + row * s_x, N, BLOCK, False)
    tl.store(y_ptr + row, (total / N).to(y_ptr.dtype.element_ty))


@triton.jit
def _sum_kernel(x_ptr, y_ptr, N, s_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    total = _row_sum(x_ptr + row * s_x, N, BLOCK, False)
    tl.store(y_ptr + row, total.to(y_ptr.dtype.element_ty))


# Elements per thread in the layout of a row of fp32 (16-byte vectors); mean_sq's kernel loads its
# narrower rows in this width so that its squares are summed in _mean_kernel's layout.
FP32_VECTOR = 4


@triton.jit
def _mean_sq_kernel(x_ptr, y_ptr, N, s_x, BLOCK: tl.constexpr, VECTOR: tl.constexpr):
    """One row's mean of fp32 squares, summed as _mean_kernel sums a row of stored fp32 squares.

    A bf16 row loads in 16-byte vectors of 8 elements, so each thread would hold 8 squares and sum
    them in another tree than _mean_kernel gives fp32 rows (4 per thread). The offsets are declared
    contiguous in runs of VECTOR only, which caps the vector at VECTOR elements: the same layout
    (sizePerThread, threads, warps) for bf16, fp16 and fp32 rows (TTGIR for sm_80 / sm_90:
    tests/test_kernels_ttgir_rows.py). x is bf16 or fp16 (mean_sq): its square is exact in fp32 (8 or 11
    significant bits, squared: at most 22 of fp32's 24), so the fused multiply-adds the compiler makes
    of `x * x` and the sum's adds round like adds of stored squares. (fp32 rows are not: on an H100 the
    mean of 300 rows of 64 differed.) One block per row (N <= BLOCK)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.max_contiguous(tl.arange(0, BLOCK), VECTOR)
    # an accumulator from zero as _mean_kernel's: the form whose layout and bits were checked (one block,
    # so 0 + x*x is the square itself)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    x = tl.load(x_ptr + row * s_x + offs, mask=offs < N, other=0.0).to(tl.float32)
    acc += x * x
    tl.store(y_ptr + row, tl.sum(acc, axis=0) / N)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, N, s_x, s_y, eps, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * s_x
    rstd = 1.0 / tl.sqrt(_row_sum(x_row, N, BLOCK, True) / N + eps)
    offs = tl.arange(0, BLOCK)
    for start in range(0, N, BLOCK):
        mask = start + offs < N
        x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * s_y + start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N, s_x, s_y, eps,
                       HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * s_x
    offs = tl.arange(0, BLOCK)
    mean = _row_sum(x_row, N, BLOCK, False) / N
    var_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        mask = start + offs < N
        x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        var_acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(var_acc, axis=0) / N + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK):
        mask = start + offs < N
        x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * s_y + start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, s_x, s_y, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * s_x
    offs = tl.arange(0, BLOCK)
    # pass 1: running max and rescaled sum, block by block in order
    m = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_row + start + offs, mask=start + offs < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - row_max), axis=0)
    # pass 2: write
    for start in range(0, N, BLOCK):
        mask = start + offs < N
        x = tl.load(x_row + start + offs, mask=mask, other=float("-inf")).to(tl.float32)
        if LOG:
            y = (x - row_max) - tl.log(total)
        else:
            y = tl.exp(x - row_max) / total
        tl.store(y_ptr + row * s_y + start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (R, N) rows, dense (row stride N) and 16-byte aligned: a copy only when it is not.

    Triton specializes a binary on whether pointers and strides are divisible by 16, and the
    vector width it loads with sets the layout a row is summed in (8 elements per thread when
    aligned, 1 when not: TTGIR of _rms_norm_kernel for sm_90), hence the row's bits. Passing
    every row in the one aligned, dense form keeps one binary, so one order, per row length.
    """
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] == 1 and x2.stride(-1) == 1:
        x2 = x2.as_strided(x2.shape, (x2.shape[1], 1))  # one row: its row stride is meaningless
    return _dense_aligned(x2)


def _dense_aligned(t: torch.Tensor) -> torch.Tensor:
    if t.is_contiguous() and aligned16(t):
        return t
    return t.clone(memory_format=torch.contiguous_format)  # fresh storage is aligned


def _weight(w: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """A per-column parameter in the aligned dense form (rows stands in when there is none)."""
    return rows if w is None else _dense_aligned(w)


# Eager row launches bound per (kernel, rows' shape, dtypes, device) (bound.py): rows reach the kernels
# dense and 16-byte aligned (_rows), so the shape fixes every integer Triton specialises on.
_PLANS = bound.Plans()


def _key(kernel, rows: torch.Tensor, y: torch.Tensor, *constants):
    """The launch's plan key (constants: its constexprs that the shape does not fix), None if not bindable."""
    return (kernel, rows.shape, rows.dtype, y.dtype, rows.device, *constants) if bound.bindable(rows) else None


def mean_last(x: torch.Tensor, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x.mean(-1, keepdim, dtype=dtype), accumulated in fp32 one row per program."""
    n = x.shape[-1]
    rows = _rows(x)
    y = torch.empty(rows.shape[0], dtype=dtype or x.dtype, device=x.device)
    block, warps = _block(n)
    if rows.shape[0]:
        bound.launch_keyed(_PLANS, _key(_mean_kernel, rows, y), _mean_kernel, (rows.shape[0],), y,
                           (rows, y, n, rows.stride(0)), dict(BLOCK=block, num_warps=warps), 2)
    shape = (*x.shape[:-1], 1) if keepdim else x.shape[:-1]
    return y.reshape(shape)


def sum_last(x: torch.Tensor, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x.sum(-1, keepdim, dtype=dtype), accumulated in fp32 one row per program (mean_last's order)."""
    rows = _rows(x)
    y = torch.empty(rows.shape[0], dtype=dtype or x.dtype, device=x.device)
    block, warps = _block(x.shape[-1])
    if rows.shape[0]:
        bound.launch_keyed(_PLANS, _key(_sum_kernel, rows, y), _sum_kernel, (rows.shape[0],), y,
                           (rows, y, x.shape[-1], rows.stride(0)), dict(BLOCK=block, num_warps=warps), 2)
    return y.reshape((*x.shape[:-1], 1) if keepdim else x.shape[:-1])


def mean_sq(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """x.float().pow(2).mean(-1, keepdim) in fp32 for bf16 / fp16 x, without writing the squares: the
    bits of mean_last over the stored squares. Rows of at most ROW_BLOCK_MAX (one block: see
    _mean_sq_kernel)."""
    n = x.shape[-1]
    if n > ROW_BLOCK_MAX or x.dtype not in SQUARE_EXACT_DTYPES:
        raise ValueError(f"mean_sq takes bf16 / fp16 rows of at most {ROW_BLOCK_MAX} elements, not {x.dtype} x {n}")
    rows = _rows(x)
    y = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    block, warps = _block(n)
    if rows.shape[0]:
        bound.launch_keyed(_PLANS, _key(_mean_sq_kernel, rows, y), _mean_sq_kernel, (rows.shape[0],), y,
                           (rows, y, n, rows.stride(0)), dict(BLOCK=block, VECTOR=FP32_VECTOR, num_warps=warps), 2)
    return y.reshape((*x.shape[:-1], 1) if keepdim else x.shape[:-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, fp32 inside, x's dtype out."""
    n = x.shape[-1]
    rows = _rows(x)
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    block, warps = _block(n)
    if rows.shape[0]:
        launch(_rms_norm_kernel, (rows.shape[0],), y)(rows, _weight(weight, rows), y, n,
                                           rows.stride(0), y.stride(0), float(eps),
                                           HAS_W=weight is not None, BLOCK=block, num_warps=warps)
    return y.reshape(x.shape)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dim -> (y, mean, rstd) as aten::native_layer_norm returns them."""
    n = x.shape[-1]
    rows = _rows(x)
    r = rows.shape[0]
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(r, dtype=torch.float32, device=x.device)
    rstd = torch.empty(r, dtype=torch.float32, device=x.device)
    block, warps = _block(n)
    if r:
        launch(_layer_norm_kernel, (r,), y)(rows, _weight(weight, rows), _weight(bias, rows), y, mean, rstd, n,
                                 rows.stride(0), y.stride(0), float(eps), HAS_W=weight is not None,
                                 HAS_B=bias is not None, BLOCK=block, num_warps=warps)
    stat_shape = (*x.shape[:-1], 1)
    return y.reshape(x.shape), mean.reshape(stat_shape), rstd.reshape(stat_shape)


def softmax(x: torch.Tensor, log: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax / log_softmax over the last dim, fp32 inside."""
    n = x.shape[-1]
    rows = _rows(x)
    y = torch.empty(rows.shape, dtype=dtype or x.dtype, device=x.device)
    block, warps = _block(n)
    if rows.shape[0] and n:
        bound.launch_keyed(_PLANS, _key(_softmax_kernel, rows, y, log), _softmax_kernel, (rows.shape[0],), y,
                           (rows, y, n, rows.stride(0), y.stride(0)), dict(LOG=log, BLOCK=block, num_warps=warps), 2)
    return y.reshape(x.shape)
