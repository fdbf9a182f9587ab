"""Prefill attention by row tile (block_m), warps and stages against SDPA, with each candidate's bits
compared with the 16-row decode tile's (GPU).

    python3 scripts/device/gpu_attention_prefill.py

block_n and kv_chunk (the order of a row's reduction) stay the shipped ones. block_m is the
question: decode uses 16-row tiles, and until 2026-11-26 prefill did too (Q = 512 ran 60 us against
cuDNN's 21 us on the 8B shapes). A larger tile is only usable where its rows equal the decode tile's
bit for bit, on every path a prefill takes: causal (mask None), transformers' bool mask, and a short
verification chunk after a cache. This sweep chose config.attention_config's rows; docs/benchmarks.md
has its table. Masked cases pass query_end and run_start as ops.attention does (a tile stops at its
rows' last visible key; rows given as runs are tested by position, no mask loaded) and compare bits
with a launch without them (the mask loaded for every key); each case also times the shipped
dispatch both ways. Times are CUDA-graph replays (launch cost left out); "BITS" marks a candidate whose
output differs from the decode tile's.
"""

import dataclasses

import torch
import torch.nn.functional as F
from gpu_attention_stages import graph_us

from nondet.kernels.config import ATTENTION_CONFIGS
from nondet.kernels.ops import query_end, run_start
from nondet.kernels.triton_attention import attention

BLOCK_MS = (16, 32, 64, 128)
WARPS_STAGES = ((4, 2), (4, 3), (8, 2), (8, 3))


def inputs(q_len: int, s_len: int, seed: int, heads: int = 32, kv_heads: int = 8, dim: int = 128):
    g = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(1, heads, q_len, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, kv_heads, s_len, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, kv_heads, s_len, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def bool_causal(q_len: int, s_len: int, written: int | None = None) -> torch.Tensor:
    """transformers' bool mask for a chunk of q_len queries at the end of s_len positions, (1, 1, Q, S);
    written: a static cache with only that many slots filled (the queries sit at its end)."""
    keys = torch.arange(s_len, device="cuda")[None, :]
    if written is not None:
        return (keys < written)[None, None].expand(1, 1, q_len, s_len)
    rows = torch.arange(q_len, device="cuda")[:, None] + (s_len - q_len)
    return (keys <= rows)[None, None]


CASES = (  # (name, Q, S, bool mask?, slots written in a static cache)
    ("prefill 512, causal", 512, 512, False, None),
    ("prefill 512, bool mask", 512, 512, True, None),
    ("prefill 2048, causal", 2048, 2048, False, None),
    ("chunk 5 after 512, bool mask", 5, 517, True, None),
    ("chunk 37 after 1000, causal", 37, 1037, False, None),
    ("static cache decode, 1000 of 4096 slots, bool mask", 1, 4096, True, 1000),
)


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    shipped = ATTENTION_CONFIGS[torch.bfloat16]
    scale = 128 ** -0.5
    start = torch.zeros(1, dtype=torch.int32, device="cuda")
    for name, q_len, s_len, masked, written in CASES:
        q, k, v = inputs(q_len, s_len, seed=q_len + s_len)
        mask = bool_causal(q_len, s_len, written) if masked else None
        ends = query_end(mask, 1, "cuda") if masked else None  # as ops.attention passes them: skips masked
        runs = run_start(mask, ends, 1) if masked else None  # chunks, tests rows given as runs by position
        keys = dict(query_end=ends, run_start=runs)
        reference = attention(q, k, v, mask, scale, start, cfg=shipped)
        sdpa = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                               is_causal=mask is None and q_len == s_len,
                                                               enable_gqa=True))
        dispatch = graph_us(lambda: attention(q, k, v, mask, scale, start, **keys))
        same = torch.equal(attention(q, k, v, mask, scale, start, **keys), reference)
        line = f"\n{name}: SDPA {sdpa:.1f} us; shipped dispatch {dispatch:.1f} us ({sdpa / dispatch:.2f}x)"
        if masked:
            loaded = graph_us(lambda: attention(q, k, v, mask, scale, start, query_end=ends))
            line += f", with the mask loaded {loaded:.1f} us"
        print(line + ("" if same else " BITS"), flush=True)
        print("| block_m | " + " | ".join(f"w{w} s{s}" for w, s in WARPS_STAGES) + " |")
        print("| ---: |" + " ---: |" * len(WARPS_STAGES))
        for block_m in BLOCK_MS:
            cells = []
            for warps, stages in WARPS_STAGES:
                cfg = dataclasses.replace(shipped, block_m=block_m, num_warps=warps, num_stages=stages)
                try:
                    same = torch.equal(attention(q, k, v, mask, scale, start, cfg=cfg, **keys), reference)
                    us = graph_us(lambda cfg=cfg: attention(q, k, v, mask, scale, start, cfg=cfg, **keys))
                    cells.append(f"{us:.1f} ({sdpa / us:.2f}x){'' if same else ' BITS'}")
                except Exception as exc:  # noqa: BLE001 - a candidate that does not compile is a cell, not a stop
                    cells.append(f"failed: {type(exc).__name__}")
            print(f"| {block_m}{' (decode tile)' if block_m == shipped.block_m else ''} | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
