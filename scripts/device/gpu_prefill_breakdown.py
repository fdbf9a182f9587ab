"""Where the 8B-shaped prefill of 512 tokens spends its GPU time under CUDA graphs, default kernels vs
the mode: the replayed graph's kernels by class (matmul, attention, row reductions, the rest), and each
of a layer's shapes timed alone (us, CUDA-graph replay), ours against cuBLAS / SDPA, times the layers;
or (`--sweep M,...`) the 8B matmul shapes under every candidate tile at each M, bits against the
shipped dispatch's, with the number of tiles per SM (a last wave that fills few SMs wastes the rest).

    python3 scripts/device/gpu_prefill_breakdown.py [--layers 36]
    python3 scripts/device/gpu_prefill_breakdown.py --sweep 512,2048
    python3 scripts/device/gpu_prefill_breakdown.py --sweep 64 --shapes tp2   # Qwen3-8B's shards at TP2

The gap between the two tables is what the graph adds around the kernels (copies, Inductor's fused
elementwise kernels, descriptor set-up); the classes say which kernels the mode loses its time in.
"""

import argparse
import collections
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from gpu_attention_stages import graph_us
from gpu_compile import build, compiled_prefill

from nondet.kernels import config, triton_attention, triton_matmul, triton_rows, tune
from nondet.kernels.config import MatmulConfig, k_chunk_for, matmul_config

CLASSES = (  # (class, substrings of kernel names), first match wins
    ("matmul", ("_mm_", "gemm", "nvjet", "xmma", "cutlass", "cublas", "sm90_")),
    ("attention", ("_attn_kernel", "flash", "fmha", "cudnn", "attention")),
    ("row reductions", ("_rms", "_mean", "_softmax", "_row", "reduce", "norm")),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((cls for cls, keys in CLASSES if any(k.lower() in low for k in keys)), "other")


def graphed_prefill(model, mode: bool, tokens: int):
    """(best ms of a replayed prefill, {kernel name: (GPU ms, calls)} of one replay)."""
    from torch.autograd import DeviceType

    best, prof = compiled_prefill(model, mode, graphs=True, tokens=tokens)
    kernels = {e.key: (e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()
               if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0}
    return best, kernels


def print_graph_tables(model, tokens: int) -> None:
    runs = {label: graphed_prefill(model, label == "mode", tokens) for label in ("default", "mode")}
    by_class = {label: collections.Counter() for label in runs}
    launches = {label: collections.Counter() for label in runs}  # kernels per replay: each adds a gap
    for label, (_, kernels) in runs.items():
        for name, (ms, calls) in kernels.items():
            by_class[label][kernel_class(name)] += ms
            launches[label][kernel_class(name)] += calls
    print(f"\nprefill {tokens} tokens, torch.compile + CUDA graphs: default {runs['default'][0]:.2f} ms, "
          f"mode {runs['mode'][0]:.2f} ms ({runs['default'][0] / runs['mode'][0]:.2f}x)")
    print("| kernel class | default GPU ms | mode GPU ms | mode - default | kernels default / mode |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for cls in [c for c, _ in CLASSES] + ["other", "all"]:
        d, m = (sum(by_class[x].values()) if cls == "all" else by_class[x][cls] for x in ("default", "mode"))
        nd, nm = (sum(launches[x].values()) if cls == "all" else launches[x][cls] for x in ("default", "mode"))
        print(f"| {cls} | {d:.2f} | {m:.2f} | {m - d:+.2f} | {nd} / {nm} |")
    for label, (_, kernels) in runs.items():
        top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:16]
        print(f"{label}, heaviest kernels (GPU ms, calls): "
              + "; ".join(f"{name[:70]} {ms:.2f} {n}" for name, (ms, n) in top), flush=True)


def print_shape_table(model, tokens: int, layers: int) -> None:
    """One layer's kernels alone at M = tokens: ours vs cuBLAS / SDPA, us, and the sum over the layers."""
    cfg = model.config
    h, kvh, d, ffn = cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    heads = cfg.num_attention_heads
    x = {k: torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16) for k in (h, ffn)}
    linears = (("q", h, heads * d), ("k", h, kvh * d), ("v", h, kvh * d), ("o", heads * d, h),
               ("gate", h, ffn), ("up", h, ffn), ("down", ffn, h))
    print(f"\none layer's shapes alone, M = {tokens} (us, CUDA-graph replay; x{layers} layers in the last row)")
    print("| op | K x N | default (cuBLAS / SDPA / torch) | ours | ours / default |")
    print("| --- | --- | ---: | ---: | ---: |")
    total = [0.0, 0.0]
    for name, k, n in linears:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        ref = graph_us(lambda: F.linear(x[k], w))
        ours = graph_us(lambda: triton_matmul.linear(x[k], w))
        total = [total[0] + ref, total[1] + ours]
        print(f"| {name} | {k} x {n} | {ref:.1f} | {ours:.1f} | {ref / ours:.2f}x |", flush=True)
    q = torch.randn(1, heads, tokens, d, device="cuda", dtype=torch.bfloat16)
    kk = torch.randn(1, kvh, tokens, d, device="cuda", dtype=torch.bfloat16)
    vv = torch.randn(1, kvh, tokens, d, device="cuda", dtype=torch.bfloat16)
    ref = graph_us(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True))
    ours = graph_us(lambda: triton_attention.attention(q, kk, vv))
    total = [total[0] + ref, total[1] + ours]
    print(f"| attention, causal | Q = S = {tokens} | {ref:.1f} | {ours:.1f} | {ref / ours:.2f}x |")
    for name, rows, width in (("input / post norms x2", 2 * tokens, h), ("q / k norms", tokens * (heads + kvh), d)):
        y = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        wt = torch.ones(width, device="cuda", dtype=torch.bfloat16)
        ref = graph_us(lambda: F.rms_norm(y, (width,), wt, 1e-6))
        ours = graph_us(lambda: triton_rows.rms_norm(y, wt, 1e-6))
        total = [total[0] + ref, total[1] + ours]
        print(f"| rms norm, {name} | {rows} x {width} | {ref:.1f} | {ours:.1f} | {ref / ours:.2f}x |")
    print(f"| one layer | | {total[0]:.1f} | {total[1]:.1f} | {total[0] / total[1]:.2f}x |")
    print(f"| x {layers} layers (ms) | | {total[0] * layers / 1e3:.2f} | {total[1] * layers / 1e3:.2f} | |", flush=True)


# the 8B shapes of Qwen3 (FFN 12288) and Llama 3 (FFN 14336): K / V, Q / O, gate / up, down
SWEEP_SHAPES = ((4096, 1024), (4096, 4096), (4096, 12288), (12288, 4096), (4096, 14336), (14336, 4096))
# Qwen3-8B's shards at TP2 (--shapes tp2): K / V, Q, O, gate / up, down
TP2_SHAPES = ((4096, 512), (4096, 2048), (2048, 4096), (4096, 6144), (6144, 4096))
# beyond the tuner's: 16 warps give the 128x256 tile's two fp32 accumulators (the running sum and the
# chunk's) half the registers per thread that 8 warps do; deeper pipelines on the 128x128 tile; for
# M 64 / 128, 64-row tiles 256 wide (A re-read from L2 once per 256 columns, not per 64 or 128: with
# --k-chunks their fewer tiles still make enough split programs)
EXTRA_CANDIDATES = tuple(MatmulConfig(bm, bn, 64, 1024, 8, w, st, tma) for bm, bn, w, st, tma in (
    (128, 256, 16, 3, True), (256, 128, 16, 3, True), (128, 128, 8, 5, True), (128, 128, 4, 4, True),
    (64, 256, 8, 3, False), (64, 256, 8, 4, False)))

# for M <= 128 (the split launch, bandwidth-bound): narrower tiles (more programs), deeper pipelines
# (more weight bytes in flight per SM), and 32-row tiles (mma.sync; the same chain of k16 steps)
SMALL_M_CANDIDATES = tuple(MatmulConfig(bm, bn, 64, 1024, 8, w, st) for bm, bn, w, st in (
    (64, 32, 4, 4), (64, 32, 4, 6), (64, 64, 4, 3), (64, 64, 4, 6), (64, 64, 4, 8), (64, 128, 4, 6),
    (64, 64, 8, 4), (32, 64, 4, 4), (32, 64, 4, 6), (32, 128, 4, 4)))


def sweep_shapes(text: str) -> tuple:
    """--shapes: "" (the 8B shapes), "tp2", or K:N pairs separated by commas."""
    if not text:
        return SWEEP_SHAPES
    if text == "tp2":
        return TP2_SHAPES
    return tuple(tuple(int(v) for v in pair.split(":")) for pair in text.split(","))


def print_tile_sweep(shapes, ms, k_chunks=(), top=5) -> None:
    """Each (K, N) at each M under every candidate tile: us (ratio to cuBLAS), tiles per SM (waves), and
    BITS where a row differs from the shipped dispatch's. k_chunks: each candidate again with these
    config k_chunks (the chunk a K gets is config.k_chunk_for: 256 gives 512 at K 4096), a K order for
    every M, never one by M: such a row's bits are checked against the shipped tile with the same chunk,
    and its name carries "K chunk <chunk>"."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m in ms:
        for k, n in shapes:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
            shipped = matmul_config(torch.bfloat16, m, k, n, x.device)  # the device's dispatch (by_waves)
            chunk = k_chunk_for(k, shipped)  # the K chunk this K gets (config.k_chunk_for)
            other = [replace(shipped, k_chunk=c) for c in k_chunks if k_chunk_for(k, replace(shipped, k_chunk=c)) != chunk]
            references = {k_chunk_for(k, cfg): triton_matmul.mm(x, w.t(), cfg=cfg) for cfg in other}
            references[chunk] = triton_matmul.mm(x, w.t())
            ref_us = graph_us(lambda: F.linear(x, w))
            cells = []
            candidates = tune.CANDIDATES + EXTRA_CANDIDATES + (SMALL_M_CANDIDATES if m <= 128 else ())
            chunked = [replace(cand, k_chunk=cfg.k_chunk) for cfg in other for cand in candidates]
            for cand in candidates + tuple(chunked):
                try:
                    same = torch.equal(triton_matmul.mm(x, w.t(), cfg=cand), references[k_chunk_for(k, cand)])
                    us = graph_us(lambda cand=cand: triton_matmul.mm(x, w.t(), cfg=cand))
                except Exception as exc:  # noqa: BLE001 - a candidate that does not compile is a cell, not a stop
                    cells.append((float("inf"), f"{tune._name(cand)} failed: {type(exc).__name__}"))
                    continue
                tiles = -(-m // cand.block_m) * -(-n // cand.block_n)
                mark = " (shipped)" if cand == shipped else ""
                name = tune._name(cand) + (f" K chunk {k_chunk_for(k, cand)}" if k_chunk_for(k, cand) != chunk else "")
                cells.append((us, f"{name}{mark} {us:.1f} ({ref_us / us:.2f}x, {tiles / sms:.2f} waves)"
                                  f"{'' if same else ' BITS'}"))
            cells.sort()
            shipped_cell = next((text for _, text in cells if "(shipped)" in text), "shipped not among candidates")
            print(f"\nM {m} K {k} N {n}: cuBLAS {ref_us:.1f} us; {shipped_cell}; fastest first: "
                  + "; ".join(text for _, text in cells[:top]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--sweep", default="", help="M values (comma-separated): every candidate tile on the "
                        "8B matmul shapes at each, instead of the tables")
    parser.add_argument("--k-chunks", default="", help="with --sweep: every candidate again with these config "
                        "k_chunks (comma-separated; 256 gives a 512 chunk at K 4096), a K order for every M")
    parser.add_argument("--shapes", default="", help="with --sweep: (K, N) pairs as K:N,... or tp2 (Qwen3-8B's "
                        "shards at TP2); default the 8B shapes")
    parser.add_argument("--top", type=int, default=5, help="with --sweep: cells printed per shape, fastest first")
    parser.add_argument("--square-stages-4", action="store_true", help="the 128x128 tile with 4 stages on every "
                        "GPU (config.DEEP_SQUARE_SMEM out of reach): the dispatch before the 5-stage one")
    parser.add_argument("--graph-only", action="store_true", help="only the replayed graph's table")
    args = parser.parse_args()
    if args.square_stages_4:
        config.DEEP_SQUARE_SMEM = 1 << 40
    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.sweep:
        chunks = [int(c) for c in args.k_chunks.split(",") if c]
        ms = [int(m) for m in args.sweep.split(",")]
        return print_tile_sweep(sweep_shapes(args.shapes), ms, chunks, args.top)
    model = build(args.layers)
    if not args.graph_only:
        print_shape_table(model, args.tokens, args.layers)
    print_graph_tables(model, args.tokens)


if __name__ == "__main__":
    main()
