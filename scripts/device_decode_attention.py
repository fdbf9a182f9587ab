"""Decode attention, ours vs SDPA, one shape per process (a CUDA fault loses only that shape).

Usage on the device machine: python3 scripts/device_decode_attention.py [--graph]
Times are triton.testing.do_bench medians (CUDA events); --graph replays a CUDA graph instead.
"""

import subprocess
import sys

SHAPES = [(b, s) for b in (1, 8, 32, 64) for s in (1024, 4096, 16384, 32768) if b * s <= 32 * 32768]

ONE = r"""
import sys, torch, triton.testing, torch.nn.functional as F
from nondet.kernels import triton_attention
b, s, graph = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
bench = triton.testing.do_bench_cudagraph if graph else triton.testing.do_bench
q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, 8, s, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
start = torch.zeros(b, dtype=torch.int32, device="cuda")
ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)
got = triton_attention.attention(q, k, v, None, None, start)
torch.cuda.synchronize()
err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
ours = bench(lambda: triton_attention.attention(q, k, v, None, None, start), rep=50, return_mode="median") * 1e3
sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), rep=50, return_mode="median") * 1e3
gbs = 2 * k.numel() * 2 / (ours * 1e-6) / 1e9
print(f"| B={b} KV={s} | {ours:.1f} | {sdpa:.1f} | {sdpa / ours:.2f} | {gbs:.0f} GB/s, rel err {err:.1e} |", flush=True)
"""


def main() -> None:
    graph = "1" if "--graph" in sys.argv else "0"
    print(f"| shape (H=32/8, D=128, bf16{', CUDA graph' if graph == '1' else ''}) | ours (us) | SDPA (us) | ratio | note |")
    print("|---|---:|---:|---:|---|")
    for b, s in SHAPES:
        r = subprocess.run([sys.executable, "-c", ONE, str(b), str(s), graph], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"| B={b} KV={s} | failed | | | {last[:120]} |", flush=True)
        else:
            print(r.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
