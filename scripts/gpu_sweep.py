"""Device sweep for M-bucketed matmul and B=1 decode attention configurations.

Usage on the device machine: python3 scripts/gpu_sweep.py matmul|matmul2|matmul3|matmul4|attention
For every candidate: bitwise equality (raw bits, so -0.0 != +0.0) with the shipped
configuration's fused launch at M=4096, for every M timed, and the CUDA-graph median time
against the default (cuBLAS / SDPA). Only candidates that keep the K (KV) reduction order may
be mixed across M; the bitwise column is the evidence.
"""

import sys

import torch
import torch.nn.functional as F
import triton.testing

from nondet.kernels import triton_attention, triton_matmul
from nondet.kernels.config import ATTENTION_CONFIGS, MATMUL_CONFIGS, AttentionConfig, MatmulConfig

MM = {
    "64x32 w4 s6": MatmulConfig(64, 32, 64, 1024, 8, 4, 6),
    "64x64 w4 s4": MatmulConfig(64, 64, 64, 1024, 8, 4, 4),
    "64x64 w4 s6": MatmulConfig(64, 64, 64, 1024, 8, 4, 6),
    "64x128 w4 s4": MatmulConfig(64, 128, 64, 1024, 8, 4, 4),
    "16x64 w4 s4": MatmulConfig(16, 64, 64, 1024, 8, 4, 4),
    "128x128 w8 s4": MatmulConfig(128, 128, 64, 1024, 8, 8, 4),
    "128x128 w4 s4": MatmulConfig(128, 128, 64, 1024, 8, 4, 4),
    "128x256 w8 s3": MatmulConfig(128, 256, 64, 1024, 8, 8, 3),
    "256x128 w8 s3": MatmulConfig(256, 128, 64, 1024, 8, 8, 3),
}
MS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)

# second round (after the first sweep chose the buckets): more tiles for M <= 1024
MM2 = {
    "32x64 w4 s4": MatmulConfig(32, 64, 64, 1024, 8, 4, 4),
    "32x128 w4 s4": MatmulConfig(32, 128, 64, 1024, 8, 4, 4),
    "16x128 w4 s4": MatmulConfig(16, 128, 64, 1024, 8, 4, 4),
    "64x64 w4 s3": MatmulConfig(64, 64, 64, 1024, 8, 4, 3),
    "64x128 w4 s3": MatmulConfig(64, 128, 64, 1024, 8, 4, 3),
    "64x256 w4 s3": MatmulConfig(64, 256, 64, 1024, 8, 4, 3),
    "128x64 w4 s4": MatmulConfig(128, 64, 64, 1024, 8, 4, 4),
    "128x128 w8 s3": MatmulConfig(128, 128, 64, 1024, 8, 8, 3),
    "128x256 w8 s4": MatmulConfig(128, 256, 64, 1024, 8, 8, 4),
}
MS2 = (1, 16, 64, 128, 256, 512, 1024)

# third round: the persistent TMA kernel for fused launches (split is forced off)
MM3 = {
    "128x256 w8 s3": MatmulConfig(128, 256, 64, 1024, 8, 8, 3),
    "128x256 w8 s3 tma": MatmulConfig(128, 256, 64, 1024, 8, 8, 3, tma=True),
    "128x256 w8 s4 tma": MatmulConfig(128, 256, 64, 1024, 8, 8, 4, tma=True),
    "128x128 w8 s4 tma": MatmulConfig(128, 128, 64, 1024, 8, 8, 4, tma=True),
    "128x128 w4 s4 tma": MatmulConfig(128, 128, 64, 1024, 8, 4, 4, tma=True),
    "64x128 w4 s4 tma": MatmulConfig(64, 128, 64, 1024, 8, 4, 4, tma=True),
    "256x128 w8 s3 tma": MatmulConfig(256, 128, 64, 1024, 8, 8, 3, tma=True),
}
MS3 = (256, 512, 1024, 2048, 4096, 8192)

# fourth round: the TMA kernel at small M (split forced off)
MM4 = {
    "64x64 w4 s4 tma": MatmulConfig(64, 64, 64, 1024, 8, 4, 4, tma=True),
    "64x128 w4 s4 tma": MatmulConfig(64, 128, 64, 1024, 8, 4, 4, tma=True),
    "64x128 w4 s3 tma": MatmulConfig(64, 128, 64, 1024, 8, 4, 3, tma=True),
    "64x256 w4 s3 tma": MatmulConfig(64, 256, 64, 1024, 8, 4, 3, tma=True),
    "128x64 w4 s4 tma": MatmulConfig(128, 64, 64, 1024, 8, 4, 4, tma=True),
    "128x128 w8 s4 tma": MatmulConfig(128, 128, 64, 1024, 8, 8, 4, tma=True),
}
MS4 = (64, 128, 256)


def bench(fn) -> float:
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def sweep_matmul(cands=MM, ms=MS, split=None) -> None:
    shipped = MATMUL_CONFIGS[torch.bfloat16]
    print("shape | cuBLAS us | bucketed (shipped) | " + " | ".join(cands))
    for k, n in ((4096, 4096), (4096, 14336), (14336, 4096), (1000, 1823)):
        torch.manual_seed(0)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        x = torch.randn(8192, k, device="cuda", dtype=torch.bfloat16)
        ref = triton_matmul.mm(x, w, cfg=shipped, split=False)
        for m in ms:
            xm = x[:m]
            base = bench(lambda: torch.mm(xm, w))
            t = bench(lambda: triton_matmul.mm(xm, w))
            cells = [f"{t:.1f} ({base / t:.2f}x){'' if same_bits(triton_matmul.mm(xm, w), ref[:m]) else ' BITS'}"]
            for cfg in cands.values():
                try:
                    ok = all(same_bits(triton_matmul.mm(xm, w, cfg=cfg, split=s), ref[:m])
                             for s in ((False, True) if split is None else (split,)))
                    t = bench(lambda: triton_matmul.mm(xm, w, cfg=cfg, split=split))
                    cells.append(f"{t:.1f} ({base / t:.2f}x){'' if ok else ' BITS'}")
                except Exception as exc:  # noqa: BLE001 - a sweep reports, never stops
                    cells.append(f"error {type(exc).__name__}: {str(exc)[:60]}")
            print(f"M={m} K={k} N={n} | {base:.1f} | " + " | ".join(cells), flush=True)


ATT = {
    "m16 n128 c512 w4 s2 (shipped)": AttentionConfig(16, 128, 512, 4, 2),
    "m16 n128 c512 w4 s3": AttentionConfig(16, 128, 512, 4, 3),
    "m16 n128 c512 w4 s4": AttentionConfig(16, 128, 512, 4, 4),
    "m16 n128 c512 w8 s3": AttentionConfig(16, 128, 512, 8, 3),
    "m16 n128 c512 w2 s3": AttentionConfig(16, 128, 512, 2, 3),
    "m16 n64 c512 w4 s4": AttentionConfig(16, 64, 512, 4, 4),
    "m16 n128 c256 w4 s3": AttentionConfig(16, 128, 256, 4, 3),
}


def sweep_attention() -> None:
    shipped = ATTENTION_CONFIGS[torch.bfloat16]
    print("decode | SDPA us | " + " | ".join(ATT))
    for b, s in ((1, 1024), (1, 4096), (1, 16384), (1, 32768), (8, 1024), (8, 4096), (64, 4096)):
        torch.manual_seed(0)
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, 8, s, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        start = torch.zeros(b, dtype=torch.int32, device="cuda")
        ref = triton_attention.attention(q, k, v, None, None, start, cfg=shipped, split=False)
        base = bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        cells = []
        for cfg in ATT.values():
            try:
                ok = all(same_bits(triton_attention.attention(q, k, v, None, None, start, cfg=cfg, split=sp), ref)
                         for sp in (False, True))
                t = bench(lambda: triton_attention.attention(q, k, v, None, None, start, cfg=cfg))
                cells.append(f"{t:.1f} ({base / t:.2f}x){'' if ok else ' BITS'}")
            except Exception as exc:  # noqa: BLE001
                cells.append(f"error {type(exc).__name__}: {str(exc)[:60]}")
        print(f"B={b} KV={s} | {base:.1f} | " + " | ".join(cells), flush=True)
        del k, v


if __name__ == "__main__":
    {"matmul": sweep_matmul, "attention": sweep_attention,
     "matmul2": lambda: sweep_matmul(MM2, MS2), "matmul3": lambda: sweep_matmul(MM3, MS3, split=False),
     "matmul4": lambda: sweep_matmul(MM4, MS4, split=False)}[sys.argv[1]]()
