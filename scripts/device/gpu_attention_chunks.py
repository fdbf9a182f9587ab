"""The attention's KV chunk (the numerics: a row's keys are summed in chunks of this fixed size, merged in
order) against SDPA, decode and prefill, one candidate (kv_chunk, block_n) per column.

    python3 scripts/device/gpu_attention_chunks.py [--decode-batches 1,8,64] [--kv 1024,4096,32768]
                                                   [--prefill 512,2048,8192]

A candidate changes the bits (unlike gpu_attention_stages.py's speed-only knobs), so each is checked on
its own terms: the batch-invariance it must keep (row 0 of a B = 8 decode equals the B = 1 decode; a
prefill's last row equals the decode of the same sequence), and its distance to an fp32 reference beside
the shipped chunk's. Times are CUDA-graph replays (gpu_attention_stages.graph_us).
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_attention_stages import graph_us  # noqa: E402

from nondet.kernels.config import (ATTENTION_CONFIGS, FEW_DECODE_PROGRAMS, LONG_CACHE,  # noqa: E402
                                   attention_config)
from nondet.kernels.triton_attention import attention  # noqa: E402

HEADS, KV_HEADS, DIM = 32, 8, 128
SHIPPED = ATTENTION_CONFIGS[torch.bfloat16]


def candidate_cfg(chunk: int, block_n: int, b: int, nq: int, s: int):
    """The launcher's tile for this launch (attention_config), with the candidate's chunk and step."""
    few = nq == 1 and b * KV_HEADS * triton.cdiv(s, chunk) < FEW_DECODE_PROGRAMS
    cfg = attention_config(torch.bfloat16, nq * HEADS // KV_HEADS, by_position=True, head_dim=DIM,
                           long_cache=s >= LONG_CACHE, few_programs=few)
    return dataclasses.replace(cfg, kv_chunk=chunk, block_n=block_n)


def inputs(b: int, nq: int, s: int, g: torch.Generator):
    q = torch.randn(b, HEADS, nq, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, KV_HEADS, s, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, KV_HEADS, s, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def fp32_error(out: torch.Tensor, q, k, v) -> float:
    """Largest |out - an fp32 SDPA| (out is (B, Q, H, D), bottom-right causal as the kernel)."""
    nq, s = q.shape[2], k.shape[2]
    causal = torch.ones(nq, s, dtype=torch.bool, device=q.device).tril(s - nq)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=causal, enable_gqa=True)
    return (out.float() - ref.transpose(1, 2)).abs().max().item()


def decode_row(b: int, s: int, cands, g) -> str:
    q, k, v = inputs(b, 1, s, g)
    start = torch.zeros(b, dtype=torch.int32, device="cuda")
    sdpa = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    cells = []
    for chunk, block_n in cands:
        cfg = candidate_cfg(chunk, block_n, b, 1, s)
        out = attention(q, k, v, None, None, start, cfg=cfg)
        us = graph_us(lambda cfg=cfg: attention(q, k, v, None, None, start, cfg=cfg))
        one = attention(q[:1], k[:1], v[:1], None, None, start[:1], cfg=candidate_cfg(chunk, block_n, 1, 1, s))
        inv = "" if torch.equal(one[0], out[0]) else " NOT-INVARIANT"
        cells.append(f"{us:.1f} ({sdpa / us:.2f}x, err {fp32_error(out, q, k, v):.1e}){inv}")
    return f"| decode B={b} KV={s} | {sdpa:.1f} | " + " | ".join(cells) + " |"


def prefill_row(s: int, cands, g) -> str:
    q, k, v = inputs(1, s, s, g)
    start = torch.zeros(1, dtype=torch.int32, device="cuda")
    sdpa = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    cells = []
    for chunk, block_n in cands:
        cfg = candidate_cfg(chunk, block_n, 1, s, s)
        out = attention(q, k, v, None, None, start, cfg=cfg)
        us = graph_us(lambda cfg=cfg: attention(q, k, v, None, None, start, cfg=cfg))
        last = attention(q[:, :, -1:], k, v, None, None, start, cfg=candidate_cfg(chunk, block_n, 1, 1, s))
        inv = "" if torch.equal(last[0, 0], out[0, -1]) else " PREFILL!=DECODE"
        cells.append(f"{us:.1f} ({sdpa / us:.2f}x, err {fp32_error(out, q, k, v):.1e}){inv}")
    return f"| prefill Q=S={s} | {sdpa:.1f} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decode-batches", default="1,8,64")
    parser.add_argument("--kv", default="1024,4096,32768")
    parser.add_argument("--prefill", default="512,2048,4096")
    parser.add_argument("--candidates", default=f"{SHIPPED.kv_chunk}:{SHIPPED.block_n},256:128,128:128,256:64",
                        help="kv_chunk:block_n pairs")
    args = parser.parse_args()
    cands = [tuple(int(x) for x in c.split(":")) for c in args.candidates.split(",")]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    names = " | ".join(f"chunk {c} step {n}" + (" (shipped)" if (c, n) == (SHIPPED.kv_chunk, SHIPPED.block_n)
                                                else "") for c, n in cands)
    print(f"| H 32/8, D 128, bf16, us (vs SDPA) | SDPA us | {names} |")
    print("|---|---:|" + "---:|" * len(cands))
    g = torch.Generator("cuda").manual_seed(0)
    for b in (int(x) for x in args.decode_batches.split(",")):
        for s in (int(x) for x in args.kv.split(",")):
            print(decode_row(b, s, cands, g), flush=True)
    for s in (int(x) for x in args.prefill.split(",")):
        print(prefill_row(s, cands, g), flush=True)


if __name__ == "__main__":
    main()
