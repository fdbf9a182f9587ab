"""Developer aid: candidate matmul kernel structures against the shipped dispatch and cuBLAS (GPU).

    python3 scripts/gpu_matmul_variants.py [--m 1,8,32,64,128,512,2048]

The shipped kernels restart the K reduction every k_chunk (a nested loop: chunks, then block_k
steps). Triton pipelines only the innermost loop, so every chunk boundary drains the pipeline.
The candidates keep the same per-element arithmetic (the same chain of block_k dots from zero per
chunk, chunk sums added in order) in other loop structures:

- flat: one loop over the block_k steps; the chunk sum is flushed into the total under an `if`;
- nest-flatten: the shipped nest with `tl.range(..., flatten=True)` (Triton fuses the nest into one
  pipelined loop);
- ws-*: the persistent TMA kernel with its tile loop warp-specialized (`tl.range(...,
  warp_specialize=True)`: a producer warp group issues the TMA loads while the others run the MMAs
  and the previous tile's epilogue), the K loop nested as shipped (ws-nest) or flat with the chunk
  sum flushed by a select (ws-flat), at the 128x128 and 128x256 tiles.

The persistent TMA kernel's variants (its tile loop flattened; descriptors built in the kernel with
tl.make_tensor_descriptor, also launched from a torch.compile'd graph) were timed by this script at
commit a66f913; docs/benchmarks.md (2026-11-25) has the figures.

Per shape: microseconds (CUDA-graph replay, median), ratio to cuBLAS, and whether the candidate's
bits equal the shipped dispatch's. A failing candidate prints its error and the others go on.
"""

import argparse
import functools
import time

import torch
import triton
import triton.language as tl

from nondet.kernels import triton_matmul
from nondet.kernels.triton_matmul import tile_coords
from nondet.kernels.config import k_chunk_for, matmul_config
from nondet.kernels.launch import triton_scratch

KNS = ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 1024))


@triton.jit
def _flat_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 K_CHUNK: tl.constexpr, GROUP_M: tl.constexpr, FLATTEN: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(pid, num_m, num_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_base = a_ptr + (offs_m % M)[:, None] * s_am
    b_base = b_ptr + (offs_n % N)[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FLATTEN:  # the shipped nest, fused by Triton into one pipelined loop
        for c in tl.range(0, tl.cdiv(K, K_CHUNK), flatten=True):
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(c * K_CHUNK, tl.minimum((c + 1) * K_CHUNK, K), BLOCK_K):
                a = tl.load(a_base + (k + offs_k)[None, :] * s_ak)
                b = tl.load(b_base + (k + offs_k)[:, None] * s_bk)
                part = tl.dot(a, b, part)
            acc = acc + part
    else:  # one loop; the chunk sum joins the total at each chunk's last step
        steps = tl.cdiv(K, BLOCK_K)
        per_chunk = K_CHUNK // BLOCK_K
        for i in range(0, steps):
            a = tl.load(a_base + (i * BLOCK_K + offs_k)[None, :] * s_ak)
            b = tl.load(b_base + (i * BLOCK_K + offs_k)[:, None] * s_bk)
            part = tl.dot(a, b, part)
            if (i % per_chunk == per_chunk - 1) | (i == steps - 1):
                acc = acc + part
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c = c_ptr + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _tma_ws_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, K_CHUNK: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS,
                   FLAT: tl.constexpr, WS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    per_chunk: tl.constexpr = K_CHUNK // BLOCK_K
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, warp_specialize=WS):
        pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FLAT:  # one K loop; at a chunk's last step its sum joins the total and the chunk restarts
            for i in range(0, steps):
                a = a_desc.load([pid_m * BLOCK_M, i * BLOCK_K])
                b = b_desc.load([pid_n * BLOCK_N, i * BLOCK_K])
                part = tl.dot(a, b.T, part)
                end = (i % per_chunk == per_chunk - 1) | (i == steps - 1)
                acc = tl.where(end, acc + part, acc)
                part = tl.where(end, 0.0, part)
        else:
            for c in range(0, tl.cdiv(K, K_CHUNK)):
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for k in range(c * K_CHUNK, tl.minimum((c + 1) * K_CHUNK, K), BLOCK_K):
                    a = a_desc.load([pid_m * BLOCK_M, k])
                    b = b_desc.load([pid_n * BLOCK_N, k])
                    part = tl.dot(a, b.T, part)
                acc = acc + part
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def tma_ws(x, w, bm, bn, warps, stages, flat_k, ws=True):
    """x (M, K) @ w (N, K).T through _tma_ws_kernel: the shipped K order (block_k 64, the dtype's chunk)."""
    m, k = x.shape
    n = w.shape[0]
    c = torch.empty((m, n), dtype=x.dtype, device=x.device)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn))
    k_chunk = k_chunk_for(k, matmul_config(x.dtype, m))
    with triton_scratch():  # the in-kernel descriptors' global memory
        _tma_ws_kernel[(programs,)](x, w, c, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, K_CHUNK=k_chunk,
                                    GROUP_M=8, NUM_PROGRAMS=programs, FLAT=flat_k, WS=ws, num_warps=warps,
                                    num_stages=stages)
    return c


def flat(x, w, cfg, flatten):
    m, k = x.shape
    n = w.shape[0]
    c = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    _flat_kernel[(tiles,)](x, w.t(), c, m, n, k, x.stride(0), x.stride(1), 1, k, c.stride(0), c.stride(1),
                           BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                           K_CHUNK=k_chunk_for(k, cfg), GROUP_M=cfg.group_m, FLATTEN=flatten,
                           num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return c


def bench(fn) -> float:
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", default="1,8,32,64,128,512,2048")
    parser.add_argument("--ws-only", action="store_true", help="only the warp-specialized TMA candidates")
    parser.add_argument("--shipped-only", action="store_true", help="time the shipped dispatch and cuBLAS only")
    parser.add_argument("--ws-tiles", default="128x128w8s4,128x256w8s3,128x128w4s4",
                        help="the ws-* candidates' tiles, BMxBNwWARPSsSTAGES, comma-separated")
    parser.add_argument("--kn", default="", help="(K, N) pairs as KxN, comma-separated (default: KNS)")
    parser.add_argument("--flat", action="store_true", help="also the flat K loop (ws-flat)")
    parser.add_argument("--nows", action="store_true", help="also each tile without warp specialization")
    args = parser.parse_args()
    tiles = [tuple(map(int, t.replace("x", " ").replace("w", " ").replace("s", " ").split()))
             for t in args.ws_tiles.split(",")]
    kns = [tuple(map(int, p.split("x"))) for p in args.kn.split(",")] if args.kn else KNS
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), flush=True)
    print("| M | K | N | cuBLAS us | shipped us (x cuBLAS) | candidate | us | x cuBLAS | bits == shipped |")
    print("| ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |", flush=True)
    for k, n in kns:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in map(int, args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cfg = matmul_config(torch.bfloat16, m, k, n, x.device)
            shipped = triton_matmul.mm(x, w.t())
            ref_us = bench(lambda: torch.mm(x, w.t()))
            ship_us = bench(lambda: triton_matmul.mm(x, w.t()))
            head = f"| {m} | {k} | {n} | {ref_us:.1f} | {ship_us:.1f} ({ref_us / ship_us:.2f}) |"
            candidates = {} if args.ws_only else {
                "flat": lambda: flat(x, w, cfg, False),
                "nest-flatten": lambda: flat(x, w, cfg, True),
            }
            for bm, bn, warps, stages in tiles:
                for flat_k in (False, True) if args.flat else (False,):
                    for ws in (True, False) if args.nows else (True,):
                        name = f"{'ws' if ws else 'nows'}-{'flat' if flat_k else 'nest'} {bm}x{bn} w{warps} s{stages}"
                        candidates[name] = functools.partial(tma_ws, x, w, bm, bn, warps, stages, flat_k, ws)
            if args.shipped_only:
                print(head, flush=True)
                continue
            for name, fn in candidates.items():
                try:
                    same = torch.equal(fn(), shipped)
                    us = bench(fn)
                    print(f"{head} {name} | {us:.1f} | {ref_us / us:.2f} | {same} |", flush=True)
                except Exception as exc:  # noqa: BLE001 - a candidate that does not compile is a finding
                    print(f"{head} {name} | FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100]} | | |",
                          flush=True)
            del x


if __name__ == "__main__":
    main()
