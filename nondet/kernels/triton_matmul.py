"""Batch-invariant matmul in Triton: mm, addmm and bmm through one kernel.

Reduction order of one output element: K is cut into chunks (a size that depends only on K and
the dtype, config.k_chunk_for), each chunk is summed from zero by a chain of `tl.dot` steps of `block_k`,
and the chunk sums are added in order, starting from zero. Two launch strategies compute
exactly that arithmetic:

- fused: one program per output tile walks all chunks (large M: enough tiles to fill the GPU);
- split: one program per (tile, chunk) writes its chunk sum to an fp32 workspace; the last of a
  tile's programs to finish (an atomic counter per tile) adds the chunk sums in chunk order and
  writes the tile (small M: the chunks give the parallelism the rows lack). Arrival order picks
  which program adds, never the order of the additions. One launch: a second kernel for the sums
  cost 0.8-2 ms of GPU time per 8B-shaped forward (docs/benchmarks.md);
- fused, persistent and TMA-fed (`_mm_tma_kernel`, buckets with `tma=True`, Hopper): one program
  per SM walks output tiles; A and the weight arrive through TMA descriptors, built on the host in
  eager and by the kernel itself inside a traced graph (torch.compile), where host ones fail.

The chunk size and block_k are the same in all three, so the choice between them changes speed,
never bits. The tile shape follows M's bucket and, between M 129 and 512, N (config.shipped_buckets);
it changes which program computes an element, not the chain of k16 MMA steps that sums it, so every
bucket gives the same bits (asserted on the device for M = 1..8192 and under the CPU interpreter).
"""

import functools
import os

import torch
import triton
import triton.language as tl

from nondet.kernels import bound, counters
from nondet.kernels.config import (TUNING_ENV, MatmulConfig, k_chunk_for, matmul_config, resident_split, sm_count,
                                   tuning_generation)
from nondet.kernels.launch import aligned16, interpreting, launch, triton_scratch

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _epilogue(acc, bias_ptr, offs_m, offs_n, s_biasm, s_biasn, alpha, beta, M, N,
              HAS_BIAS: tl.constexpr, UNIT_SCALE: tl.constexpr):
    # Shared by both launch strategies so the epilogue arithmetic is one piece of code.
    if HAS_BIAS:
        bmask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        bias = tl.load(bias_ptr + offs_m[:, None] * s_biasm + offs_n[None, :] * s_biasn,
                       mask=bmask, other=0.0).to(tl.float32)
        if UNIT_SCALE:
            acc = acc + bias
        else:
            acc = tl.fma(acc, alpha, bias * beta)
    else:
        if not UNIT_SCALE:
            acc = acc * alpha
    return acc


@triton.jit
def _store_tile(acc, c_ptr, bias_ptr, pid_b, offs_m, offs_n, s_cb, s_cm, s_cn, s_biasb, s_biasm, s_biasn,
                alpha, beta, M, N, HAS_BIAS: tl.constexpr, UNIT_SCALE: tl.constexpr):
    """The epilogue (bias, scales) and the store of one output tile of batch entry pid_b."""
    acc = _epilogue(acc, bias_ptr + pid_b * s_biasb, offs_m, offs_n, s_biasm, s_biasn,
                    alpha, beta, M, N, HAS_BIAS, UNIT_SCALE)
    c = c_ptr + pid_b * s_cb + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of output tile number `tile` in grouped order: GROUP_M row tiles
    share their columns' weight reads in L2. Scheduling only; a tile's arithmetic is the same anywhere."""
    group = tile // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (tile % (GROUP_M * num_n)) % size_m, (tile % (GROUP_M * num_n)) // size_m


@triton.jit
def chunk_sums(a_base, b_base, s_ak, s_bk, K, c_lo, c_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, K_CHUNK: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
               UPCAST: tl.constexpr):
    """The K order of one (BLOCK_M, BLOCK_N) tile, fp32: chunks c_lo..c_hi-1 of K_CHUNK, each summed
    from zero by a chain of BLOCK_K dots, the chunk sums added in order from zero. a_base (BLOCK_M, 1)
    and b_base (1, BLOCK_N) point at each row's / column's first element; shared by every pointer kernel
    (the plain and the grouped matmul), so they sum alike."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c in range(c_lo, c_hi):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_hi = tl.minimum((c + 1) * K_CHUNK, K)
        for k in range(c * K_CHUNK, k_hi, BLOCK_K):
            ks = k + offs_k
            if EVEN_K:
                a = tl.load(a_base + ks[None, :] * s_ak)
                b = tl.load(b_base + ks[:, None] * s_bk)
            else:
                a = tl.load(a_base + ks[None, :] * s_ak, mask=ks[None, :] < K, other=0.0)
                b = tl.load(b_base + ks[:, None] * s_bk, mask=ks[:, None] < K, other=0.0)
            if UPCAST:  # the CPU interpreter's tl.dot misreads bf16/fp16; bf16 products are exact in fp32
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            part = tl.dot(a, b, part, input_precision=PRECISION)
        acc = acc + part
    return acc


@triton.jit(do_not_specialize=["M"])  # one binary for every batch size
def _mm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, ws_ptr, count_ptr,
               M, N, K,
               s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn,
               s_biasb, s_biasm, s_biasn, alpha, beta,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               K_CHUNK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
               SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, UNIT_SCALE: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, NUM_CHUNKS: tl.constexpr):
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(pid, num_m, num_n, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = offs_m % M  # wrapped rows compute throw-away values; each row's dot uses only its own data
    rn = offs_n % N
    a_base = a_ptr + pid_b * s_ab + rm[:, None] * s_am
    b_base = b_ptr + pid_b * s_bb + rn[None, :] * s_bn

    if SPLIT:
        c_lo = tl.program_id(2)
        c_hi = c_lo + 1
    else:
        c_lo = 0
        c_hi = tl.cdiv(K, K_CHUNK)
    acc = chunk_sums(a_base, b_base, s_ak, s_bk, K, c_lo, c_hi, BLOCK_M, BLOCK_N, BLOCK_K, K_CHUNK, EVEN_K,
                     PRECISION, UPCAST)

    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT:
        # workspace: (chunks, batch, M, N) fp32, contiguous; counters: (batch, tiles) int32, zero
        nb = tl.num_programs(1)
        chunks = tl.num_programs(2)
        ws = ws_ptr + (pid_b * M + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(ws + c_lo * nb * M * N, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's part of the chunk sum is written before the release below
        counter = count_ptr + pid_b * tl.num_programs(0) + pid
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == chunks - 1:  # the tile's other chunk sums are all written: add them in order, from zero
            tl.store(counter, 0)  # every program has counted: zero again for the next launch (counters.py)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            if NUM_CHUNKS > 0:  # unrolled: the loads are independent and can all be in flight before the adds
                for c in tl.static_range(NUM_CHUNKS):
                    acc = acc + tl.load(ws + c * nb * M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            else:  # one L2 round trip per chunk
                for c in range(0, chunks):
                    acc = acc + tl.load(ws + c * nb * M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            _store_tile(acc, c_ptr, bias_ptr, pid_b, offs_m, offs_n, s_cb, s_cm, s_cn, s_biasb, s_biasm,
                        s_biasn, alpha, beta, M, N, HAS_BIAS, UNIT_SCALE)
    else:
        _store_tile(acc, c_ptr, bias_ptr, pid_b, offs_m, offs_n, s_cb, s_cm, s_cn, s_biasb, s_biasm,
                    s_biasn, alpha, beta, M, N, HAS_BIAS, UNIT_SCALE)


@triton.jit(do_not_specialize=["M", "NUM_PROGRAMS"])  # one binary for every batch size
def _mm_tma_kernel(a_src, b_src, c_ptr, bias_ptr, M, N, K, s_cm, s_cn, s_biasm, s_biasn, alpha, beta,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   K_CHUNK: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS,
                   HAS_BIAS: tl.constexpr, UNIT_SCALE: tl.constexpr, UPCAST: tl.constexpr,
                   DEVICE_DESC: tl.constexpr):
    """The fused strategy as a persistent kernel whose tiles arrive by TMA: A is (M, K) and B is
    the weight as stored, (N, K). Per element the same chunks, the same chain of block_k dots
    from zero, the same in-order chunk sums as _mm_kernel (rows past M and K past its end load
    as zeros instead of wrapped rows / masked zeros: neither reaches a valid element).

    a_src / b_src: host TMA descriptors of A and B, or with DEVICE_DESC the row-major tensors
    themselves, from which the kernel builds the same descriptors (the same tiles, the same bits)."""
    if DEVICE_DESC:  # Triton takes their scratch memory from its allocator (Inductor sets one)
        a_desc = tl.make_tensor_descriptor(a_src, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_src, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        a_desc = a_src
        b_desc = b_src
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for c in range(0, tl.cdiv(K, K_CHUNK)):
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(c * K_CHUNK, tl.minimum((c + 1) * K_CHUNK, K), BLOCK_K):
                a = a_desc.load([pid_m * BLOCK_M, k])
                b = b_desc.load([pid_n * BLOCK_N, k])
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                part = tl.dot(a, b.T, part)
            acc = acc + part
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        _store_tile(acc, c_ptr, bias_ptr, 0, offs_m, offs_n, 0, s_cm, s_cn, 0, s_biasm, s_biasn,
                    alpha, beta, M, N, HAS_BIAS, UNIT_SCALE)  # one matrix: batch entry 0


def use_split(batch: int, m: int, n: int, k: int, cfg: MatmulConfig, device: torch.device,
              fraction: int = 1) -> bool:
    """Split K over programs when the output tiles alone (fewer than SMs / fraction) leave the GPU
    idle. Speed only."""
    chunks = triton.cdiv(k, k_chunk_for(k, cfg))
    tiles = batch * triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    return chunks > 1 and tiles * fraction < sm_count(device)


def bmm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
        alpha: float = 1.0, beta: float = 1.0, out_dtype: torch.dtype | None = None,
        split: bool | None = None, cfg: MatmulConfig | None = None) -> torch.Tensor:
    """(B, M, K) @ (B, K, N) [* alpha + beta * bias] -> (B, M, N); bias broadcasts to (B, M, N).

    `split` forces a launch strategy and `cfg` a configuration (tests and benchmarks); None
    picks by occupancy / by dtype and M bucket. All of them give the same bits.
    """
    assert a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]
    assert a.dtype == b.dtype and a.dtype in SUPPORTED_DTYPES, a.dtype
    nb, m, k = a.shape
    n = b.shape[2]
    cfg = cfg or matmul_config(a.dtype, m, k, n, a.device)  # tiles by M bucket; the K order is the dtype's
    c = torch.empty((nb, m, n), dtype=out_dtype or a.dtype, device=a.device)
    if m == 0 or n == 0 or nb == 0:
        return c
    if k == 0:
        return c.copy_(_bias_only(bias, c, beta))
    tma = cfg.tma and nb == 1 and _tma_ok(a[0], b[0])
    if split is None:  # the persistent TMA kernel keeps the GPU busy down to a quarter as many tiles as SMs
        split = use_split(nb, m, n, k, cfg, a.device, 4 if tma else 1)
    # Below that (narrow N: a 512 x 4096 @ 4096 x 1024 K/V projection has 32 tiles) splitting K gives
    # the parallelism: 24.3 -> 20.3 us on an H100 (2026-11-25); at 64-128 tiles splitting was slower
    # (512 x 4096 @ 4096 x 4096: 31.1 -> 64.4 us), so those stay on the TMA kernel.
    tma = tma and not split
    has_bias = bias is not None
    bias_t = bias.expand(nb, m, n) if has_bias else c
    unit = alpha == 1.0 and (beta == 1.0 or not has_bias)
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    common = dict(HAS_BIAS=has_bias, UNIT_SCALE=unit)
    k_chunk = k_chunk_for(k, cfg)
    chunks = triton.cdiv(k, k_chunk)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if split:
        cfg = resident_split(cfg, nb * tiles * chunks, a.device)
    if not split and tma:
        _mm_tma(a[0], b[0], c[0], None if not has_bias else bias_t[0], alpha, beta, cfg)
        return c
    ws = torch.empty((chunks, nb, m, n), dtype=torch.float32, device=a.device) if split else c
    counts = counters.zeroed(nb * tiles, c) if split else c  # (batch, tiles), left at zero by the launch
    launch(_mm_kernel, (tiles, nb, chunks if split else 1), c)(
        a, b, c, bias_t, ws, counts, m, n, k,
        a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
        c.stride(0), c.stride(1), c.stride(2),
        bias_t.stride(0), bias_t.stride(1), bias_t.stride(2), float(alpha), float(beta),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, K_CHUNK=k_chunk,
        GROUP_M=cfg.group_m, EVEN_K=(k % cfg.block_k == 0), SPLIT=split, PRECISION=precision,
        UPCAST=interpreting(), NUM_CHUNKS=chunks if split and UNROLL_CHUNK_SUM else 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common)
    return c


def _tma_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A row-major (M, K) A and a weight stored (N, K) (b is its (K, N) transpose view), 16-byte
    aligned, on Hopper or newer. Inside a trace too: there the kernel builds its descriptors itself."""
    if a.dtype not in (torch.bfloat16, torch.float16):
        return False
    if a.device.type == "cuda" and _capability(a.device)[0] < 9:
        return False
    # A fake tensor (a trace) has no address: aligned16 then asks its storage offset for 16 bytes,
    # since allocations themselves are 16-byte aligned. Rows of K elements (both operands' row
    # stride) must be 16-byte multiples too, as TMA requires.
    k = a.shape[1]
    return (a.stride(1) == 1 and a.stride(0) == k and b.stride(0) == 1 and b.stride(1) == b.shape[0]
            and (k * a.element_size()) % 16 == 0 and aligned16(a) and aligned16(b))


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)  # 20 us a call: it ran on every matmul


# The split launch's last program adds the tile's chunk sums with the loop unrolled (one binary per
# chunk count, i.e. per K), so their loads overlap instead of one L2 round trip per chunk; the same
# additions in the same order. False: the rolled loop (benchmarks compare the two).
UNROLL_CHUNK_SUM = True

# Eager launches build the TMA descriptors in the kernel too: two host descriptors and their
# launch cost ~30 us of host time per matmul (95 -> 63 us, H100, 2026-11-25) for the same bits.
# False brings back host descriptors (benchmarks, tests).
EAGER_DEVICE_DESC = True


def _device_desc(a: torch.Tensor) -> bool:
    """Whether the TMA kernel builds its descriptors in the kernel: always inside a trace (a is fake;
    Inductor (torch 2.11) fails on host descriptors built in a triton_op's body but launches a kernel
    that builds its own, giving it scratch memory), and in eager unless EAGER_DEVICE_DESC is off."""
    if EAGER_DEVICE_DESC:
        return True
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(a)


def _host_descs(a, b, cfg):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k]),
            TensorDescriptor.from_tensor(b.t(), [cfg.block_n, cfg.block_k]))  # the weight as stored, (N, K)


def _mm_tma(a, b, c, bias, alpha, beta, cfg):
    """c = a (M, K) @ b (K, N) [* alpha + beta * bias (M, N)] through the persistent TMA kernel.
    Returns what a BoundLaunch needs: the launch's result (the compiled kernel, in eager), grid,
    positional arguments and keywords."""
    m, n = c.shape
    unit = alpha == 1.0 and (beta == 1.0 or bias is None)
    device_desc = _device_desc(a)
    a_src, b_src = (a, b.t()) if device_desc else _host_descs(a, b, cfg)
    programs = min(sm_count(a.device), triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n))
    bias_t = bias if bias is not None else c
    args = (a_src, b_src, c, bias_t, m, n, a.shape[1], c.stride(0), c.stride(1),
            bias_t.stride(0), bias_t.stride(1), float(alpha), float(beta))
    meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, K_CHUNK=k_chunk_for(a.shape[1], cfg),
                GROUP_M=cfg.group_m, NUM_PROGRAMS=programs, HAS_BIAS=bias is not None, UNIT_SCALE=unit,
                UPCAST=interpreting(), DEVICE_DESC=device_desc, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    with triton_scratch():  # the descriptors' global memory (a traced launch gets Inductor's instead)
        result = launch(_mm_tma_kernel, (programs,), c)(*args, **meta)
    return result, (programs,), args, meta


# Eager TMA matmuls without bias (a transformers linear), bound per _plan_key (bound.py): ~10 us of
# Triton's dispatch and our own (config, TMA eligibility, split decision) skipped per call. False:
# every launch through the JIT (benchmarks compare the two).
BIND_EAGER_LAUNCHES = True
_TMA_PLANS = bound.Plans()


def _plan_key(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """Everything mm's TMA launch without bias depends on: shapes and strides (so M, N, K, the tile,
    the split decision and every integer Triton specialises on), dtypes, the device, the operands'
    16-byte alignment, the descriptor switch and which tuned table is loaded."""
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, a.data_ptr() % 16 == 0,
            b.data_ptr() % 16 == 0, EAGER_DEVICE_DESC, tuning_generation(), os.environ.get(TUNING_ENV))


def _bound_mm(a: torch.Tensor, b: torch.Tensor, plan: bound.BoundLaunch) -> torch.Tensor:
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    with triton_scratch():
        plan(a, b.t(), c, c)  # bias_ptr: c, as _mm_tma passes it without a bias
    return c


def _bias_only(bias, c, beta):
    if bias is None:
        return torch.zeros_like(c)
    return (bias.float() * beta).expand_as(c)


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
       alpha: float = 1.0, beta: float = 1.0, split: bool | None = None,
       cfg: MatmulConfig | None = None) -> torch.Tensor:
    """(M, K) @ (K, N) [* alpha + beta * bias] -> (M, N); bias is (N,), (1, N) or (M, N)."""
    assert a.dim() == 2 and b.dim() == 2
    bindable = (BIND_EAGER_LAUNCHES and bias is None and split is None and cfg is None and alpha == 1.0
                and bound.bindable(a))
    if bindable:
        key = _plan_key(a, b)
        plan = _TMA_PLANS.get(key)
        if plan is not None:
            return _bound_mm(a, b, plan)
    m, k = a.shape
    n = b.shape[1]
    cfg = cfg or matmul_config(a.dtype, m, k, n, a.device)
    if (split is not True and m and n and k and cfg.tma and a.dtype == b.dtype and _tma_ok(a, b)
            and (split is False or not use_split(1, m, n, k, cfg, a.device, 4))):
        # the persistent TMA kernel straight away: bmm's 3-d views cost the host ~10 us per call
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        compiled, grid, args, meta = _mm_tma(a, b, c, None if bias is None else bias.expand(m, n), alpha, beta, cfg)
        if bindable and meta["DEVICE_DESC"] and compiled is not None:
            _TMA_PLANS.add(key, bound.BoundLaunch(_mm_tma_kernel, compiled, grid, args, meta, 4, c.device.index))
        return c
    bias3 = None if bias is None else bias.expand(a.shape[0], b.shape[1]).unsqueeze(0)
    return bmm(a.unsqueeze(0), b.unsqueeze(0), bias3, alpha=alpha, beta=beta, split=split, cfg=cfg)[0]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on inputs of any rank: rows are flattened, so a row never sees its neighbours."""
    rows = x.reshape(-1, x.shape[-1])
    out = mm(rows, weight.t(), bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])
