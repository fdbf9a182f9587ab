"""Device diagnostic: does a query row get the same bits inside a multi-query tile as alone?

Compares, on random bf16 data shaped like the demo model (H 8, KVH 4, D 64), each position's
attention computed
  decode      alone (Q = 1) over KV [0, p], mask None (the kernel's causal path)
  decode+mask alone with an explicit all-true bool mask
  chunk+mask  inside a chunk of 5 queries with transformers' bool causal mask
  chunk       inside a chunk of 5 queries, mask None (bottom-right causal)
and counts rows whose bits differ from `decode`. Dumps the TTGIR of every compiled binary to
$OUT so the layouts of the reductions can be compared. Usage: python scripts/gpu_attn_rows.py
"""

import os
import sys

import torch

from nondet.kernels import triton_attention as ta

H, KVH, D, K = 8, 4, 64, 5


def causal_mask(q_len: int, s: int, device) -> torch.Tensor:
    """(1, 1, Q, S) bool, query i at position s - q_len + i (what sdpa_mask builds)."""
    qpos = torch.arange(s - q_len, s, device=device)[:, None]
    return (torch.arange(s, device=device)[None, :] <= qpos)[None, None]


def trial(s: int, gen: torch.Generator, variant: str) -> tuple[int, int, int, int]:
    dev = "cuda"
    q = torch.randn(1, H, s, D, generator=gen, device=dev).mul(2).bfloat16()
    k = torch.randn(1, KVH, s, D, generator=gen, device=dev).mul(2).bfloat16()
    v = torch.randn(1, KVH, s, D, generator=gen, device=dev).bfloat16()
    lo = s - K
    rows = []
    for p in range(lo, s):
        kw = {} if variant == "auto" else {"split": False}
        a = ta.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], None, **kw)
        b = ta.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1],
                         torch.ones(1, 1, 1, p + 1, dtype=torch.bool, device=dev), **kw)
        rows.append((a, b))
    dec = torch.cat([r[0] for r in rows], 1)
    dec_m = torch.cat([r[1] for r in rows], 1)
    kw = {} if variant == "auto" else {"split": False}
    ch_m = ta.attention(q[:, :, lo:], k, v, causal_mask(K, s, dev), **kw)
    ch = ta.attention(q[:, :, lo:], k, v, None, **kw)
    def ndiff(x): return int((x != dec).flatten(2).any(-1).sum())
    return ndiff(dec_m), ndiff(ch_m), ndiff(ch), int((ch_m != dec_m).flatten(2).any(-1).sum())


def dump_binaries(out: str) -> None:
    n = 0
    for fn in (ta._attn_kernel, ta._combine_kernel):
        for caches in getattr(fn, "device_caches", {}).values():
            for key, kernel in caches[0].items():
                n += 1
                with open(os.path.join(out, f"{fn.__name__}_{n}.ttgir"), "w") as f:
                    f.write(f"// key: {key}\n")
                    f.write(kernel.asm.get("ttgir", ""))
                with open(os.path.join(out, f"{fn.__name__}_{n}.ptx"), "w") as f:
                    f.write(kernel.asm.get("ptx", ""))
    print(f"dumped {n} binaries")


def main() -> None:
    out = os.environ.get("OUT", "/tmp")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for variant in ("nosplit", "auto"):
        tot = [0, 0, 0, 0]
        for s in list(range(8, 140, 7)) + [255, 256, 257, 511, 512, 513, 700, 1030]:
            r = trial(s, gen, variant)
            tot = [a + b for a, b in zip(tot, r)]
            if any(r):
                print(f"{variant} S={s}: rows differing from decode: decode+mask {r[0]}, chunk+mask {r[1]}, "
                      f"chunk {r[2]}; chunk+mask vs decode+mask {r[3]} (of {K * H})", flush=True)
        print(f"{variant} TOTAL: decode+mask {tot[0]}, chunk+mask {tot[1]}, chunk {tot[2]}, cm vs dm {tot[3]}",
              flush=True)
    dump_binaries(out)


if __name__ == "__main__":
    sys.exit(main())
