"""Small-M matmuls (decode, M = 1..16; decode batches, M 64 / 128) under other tiles than the shipped one.

    python3 scripts/gpu_decode_tiles.py [--m 1,16] [--narrow 32:64:4:4,...] [--splits fused,auto]

The shipped decode buckets split K over programs, which costs a workspace round trip (and, until
2026-11-27, a counter fill per matmul: nondet/kernels/counters.py). A fused tile narrow enough to
give as many programs (16 x 16: N / 16 tiles) walks the same K chunks in the same order, so it gives
the same bits (checked per cell). Each cell is timed under a CUDA graph that cycles over 4 copies of
the weight (> L2 together for every shape here, as a decode's layers are), microseconds per matmul;
BITS marks a cell whose output differs.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from gpu_attention_stages import graph_us

from nondet.kernels import triton_matmul
from nondet.kernels.config import MatmulConfig, matmul_config

SHAPES = ((4096, 1024), (4096, 4096), (4096, 12288), (12288, 4096), (4096, 14336), (14336, 4096))
COPIES = 4
# (block_m, block_n, warps, stages); block_k and k_chunk are the dtype's K order
NARROW = ((16, 16, 2, 4), (16, 16, 4, 4), (16, 16, 4, 6), (16, 32, 4, 4), (16, 32, 4, 6), (16, 64, 4, 4))


def per_matmul_us(matmul, weights) -> float:
    """us per call of matmul(w), under a CUDA graph that cycles over the weight copies five times."""
    return graph_us(lambda: [matmul(w) for w in weights], calls=5) / len(weights)


def cell(x, weights, cfg, split, reference):
    """(us per matmul of one launch choice over the weight copies, whether its output has the shipped bits)."""
    same = torch.equal(triton_matmul.mm(x, weights[0].t(), split=split, cfg=cfg), reference)
    return per_matmul_us(lambda w: triton_matmul.mm(x, w.t(), split=split, cfg=cfg), weights), same


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", default="1,16")
    parser.add_argument("--narrow", default="", help="tiles as [block_m:]block_n:warps:stages,... (block_m 16 "
                        "when left out; default: NARROW)")
    parser.add_argument("--splits", default="fused,auto", help="fused (no split K), auto (the occupancy rule) or both")
    args = parser.parse_args()
    narrow = [tuple(int(v) for v in ("16:" * (spec.count(":") == 2) + spec).split(":"))
              for spec in args.narrow.split(",")] if args.narrow else NARROW
    splits = [{"fused": False, "auto": None}[name] for name in args.splits.split(",")]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          flush=True)
    for m in (int(v) for v in args.m.split(",")):
        for k, n in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(COPIES)]
            shipped = matmul_config(torch.bfloat16, m, k, n, x.device)
            reference = triton_matmul.mm(x, weights[0].t())
            cublas = per_matmul_us(lambda w: F.linear(x, w), weights)
            ours, _ = cell(x, weights, shipped, None, reference)
            cells = []
            for block_m, block_n, warps, stages in narrow:
                cfg = MatmulConfig(block_m, block_n, shipped.block_k, shipped.k_chunk, shipped.group_m, warps, stages)
                for split in splits:  # None: the occupancy rule (use_split) picks
                    try:
                        us, same = cell(x, weights, cfg, split, reference)
                    except Exception as exc:  # noqa: BLE001 - a candidate that fails is a cell, not a stop
                        cells.append((float("inf"), f"{block_m}x{block_n} w{warps} s{stages} failed: {type(exc).__name__}"))
                        continue
                    label = "fused" if split is False else "auto"
                    cells.append((us, f"{block_m}x{block_n} w{warps} s{stages} {label} {us:.1f} ({cublas / us:.2f}x)"
                                      f"{'' if same else ' BITS'}"))
            cells.sort()
            differ = sum(text.endswith(" BITS") for _, text in cells)
            print(f"M {m} K {k} N {n}: cuBLAS {cublas:.1f} us; shipped {ours:.1f} ({cublas / ours:.2f}x); "
                  f"{differ} of {len(cells)} cells differ in bits; fastest: "
                  + "; ".join(text for _, text in cells[:6]), flush=True)
            del weights
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
