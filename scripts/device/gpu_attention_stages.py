"""Decode attention at B = 1 against SDPA, by the kernel's pipeline depth, warps and the split merge's
load block (speed-only knobs: block_n and kv_chunk, the numerics, stay the shipped ones; each
candidate's bits are compared with the shipped configuration's).

    python3 scripts/device/gpu_attention_stages.py [--batches 1,8,32] [--kv 1024,4096]

Times are CUDA-graph replays (20 calls per graph, median of 5 replays), so launch cost is left out.
"(shipped)" marks ATTENTION_CONFIGS' decode tile; from config.LONG_CACHE keys the launcher takes it with 8 warps.
"""

import argparse
import dataclasses
import statistics

import torch
import torch.nn.functional as F

from nondet.kernels.config import ATTENTION_CONFIGS
from nondet.kernels.triton_attention import attention

# (num_warps, num_stages, merge_block, split: None = the launcher's choice, False = one program per tile).
# One program per tile (no split) was 0.08-0.35x of SDPA at B = 1 (H100, 2026-11-26): not a candidate.
CANDIDATES = ((4, 2, 4, None), (4, 3, 4, None), (8, 2, 4, None), (8, 3, 4, None), (8, 4, 4, None))


def graph_us(fn, calls: int = 20, replays: int = 5, before_replay=None) -> float:
    """Microseconds per call of fn(), captured `calls` times in one CUDA graph: the median of `replays`
    replays. before_replay: run before each (the ranks of a collective align on a barrier)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        if before_replay is not None:
            before_replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1", help="batch sizes, one table row per (B, KV)")
    parser.add_argument("--kv", default="1024,4096,8192,16384,32768", help="cache lengths")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    shipped = ATTENTION_CONFIGS[torch.bfloat16]
    shipped_key = (shipped.num_warps, shipped.num_stages, shipped.merge_block, None)
    header = " | ".join(f"w{w} s{s} merge {mb}{' fused' if split is False else ''}"
                        + (" (shipped)" if (w, s, mb, split) == shipped_key else "") for w, s, mb, split in CANDIDATES)
    print(f"| H 32/8, D 128 | SDPA us | launcher's choice | {header} |")
    print("|---|---:|---:|" + "---:|" * len(CANDIDATES))
    g = torch.Generator("cuda").manual_seed(0)
    for b in (int(x) for x in args.batches.split(",")):
        for kv in (int(x) for x in args.kv.split(",")):
            print(row(b, kv, shipped, g), flush=True)


def row(b: int, kv: int, shipped, g) -> str:
    """One (B, KV) row: SDPA, the launcher's own configuration, then every candidate (us, ratio, bits)."""
    q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, 8, kv, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, 8, kv, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 128 ** -0.5
    start = torch.zeros(b, dtype=torch.int32, device="cuda")
    sdpa = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True))
    reference = attention(q, k, v, None, scale, start)
    own = graph_us(lambda: attention(q, k, v, None, scale, start))
    cells = []
    for warps, stages, merge_block, split in CANDIDATES:
        cfg = dataclasses.replace(shipped, num_warps=warps, num_stages=stages, merge_block=merge_block)
        try:
            out = attention(q, k, v, None, scale, start, cfg=cfg, split=split)
            us = graph_us(lambda cfg=cfg, split=split: attention(q, k, v, None, scale, start, cfg=cfg, split=split))
            cells.append(f"{us:.1f} ({sdpa / us:.2f}x){'' if torch.equal(out, reference) else ' BITS'}")
        except Exception as exc:  # noqa: BLE001 - a candidate that does not compile is a cell, not a stop
            cells.append(f"failed: {type(exc).__name__}")
    return f"| B={b} KV={kv} | {sdpa:.1f} | {own:.1f} ({sdpa / own:.2f}x) | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
