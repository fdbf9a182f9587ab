"""Matmul at decode-sized M (the split-K launch) against cuBLAS, with the last program's chunk-sum loop
rolled (one L2 round trip per chunk) and unrolled (triton_matmul.UNROLL_CHUNK_SUM), bits compared.

    python3 scripts/gpu_matmul_small_m.py

us per call, CUDA-graph replay (gpu_attention_stages.graph_us), ratio to cuBLAS in brackets.
"""

import torch
import torch.nn.functional as F
from gpu_attention_stages import graph_us

from nondet.kernels import triton_matmul

MS = (1, 16, 64, 128)
KN = ((4096, 1024), (4096, 4096), (4096, 14336), (14336, 4096))


def ours_us(x, w, unrolled: bool) -> tuple[float, torch.Tensor]:
    triton_matmul.UNROLL_CHUNK_SUM = unrolled
    try:
        return graph_us(lambda: triton_matmul.mm(x, w.t())), triton_matmul.mm(x, w.t())
    finally:
        triton_matmul.UNROLL_CHUNK_SUM = True


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("| M | K x N | cuBLAS us | rolled sum | unrolled sum | same bits |")
    print("| ---: | --- | ---: | ---: | ---: | --- |")
    for m in MS:
        for k, n in KN:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
            ref = graph_us(lambda: F.linear(x, w))
            rolled, out_rolled = ours_us(x, w, False)
            unrolled, out_unrolled = ours_us(x, w, True)
            print(f"| {m} | {k} x {n} | {ref:.1f} | {rolled:.1f} ({ref / rolled:.2f}x) | {unrolled:.1f} "
                  f"({ref / unrolled:.2f}x) | {torch.equal(out_rolled, out_unrolled)} |", flush=True)


if __name__ == "__main__":
    main()
