"""Benchmark the static probe: wall time and time per decode step for a fixed setup.

    python scripts/bench_probe.py                       # the CPU case: 8 prompts x 300 tokens x 1,2,4,8
    python scripts/bench_probe.py --tokens 200 --batch-sizes 1,2,8   # the README's first command
    python scripts/bench_probe.py --placement ends      # the per-prompt filler sweep
    python scripts/bench_probe.py --gpu [--compile]     # the GPU case (needs CUDA), default and mode

Prints one line per figure: wall time (model load excluded: it is the same before and after),
generate calls, decode steps (one forward of a whole batch; summed over calls) and wall time
per decode step, plus the verdict's counts so a faster run is seen to find the same things.
Runs through the library (run_probe) on the embedded default model, so it needs no network.
`--placement ends` also runs on older trees, for before/after figures.

The GPU case: a random Qwen3 hidden 1024 x 8 layers bf16 built in code, one prompt, 200 tokens,
batch sizes 1..128 with the target at both ends (15 runs), timed once per kernel mode after an
untimed warm-up probe; plus the memory roofline of a batch-1 decode step (weight bytes + KV bytes
at the last step) / HBM bandwidth, and the measured step time against it. With `--compile` every
condition decodes on the compiled path (`probe --compile`): the table then splits each mode's wall
time into compile + warm-up and the decoding itself, and compares the decoding with the eager
figures of the same case on an H200 (EAGER_H200_SECONDS).
"""

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from nondet.probes.core.corpus import DEMO_PROMPTS
from nondet.probes.models.default_model import DefaultModelSpec, default_model_dir
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.probe import ProbeConfig, run_probe

DETLLM_SECONDS = 77.8  # detLLM 0.1.1 on the CPU case, measured on this kind of machine (2026-11)
GATE_SECONDS = 111.8  # `nondet gate` on the same case, before the probe planned rows (2026-11)
GPU_SECONDS = {"default": 80.0, "batch-invariant": 42.0}  # the GPU case before the row plan, an H200
# the GPU case eager (dynamic cache), H200, torch 2.11, transformers 5.17, 2026-11-23: the figures the
# compiled path is measured against (docs/benchmarks.md)
EAGER_H200_SECONDS = {"default": 114.7, "batch-invariant": 58.0}
GPU_CASE = DefaultModelSpec(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=64)
# HBM bandwidth, bytes/s, by device-name fragment (vendor specs: H100 SXM 3.35 TB/s, H200 4.8 TB/s)
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def main() -> None:
    args = _parse()
    if args.gpu:
        return _main_gpu(args)
    config = _config(args)
    load_model(config.model)  # warm: the first load builds and caches the embedded model
    started = time.perf_counter()
    result = run_probe(config)
    wall = time.perf_counter() - started
    calls, steps = _calls_and_steps(result.run_dir)
    m = result.summary["modes"]["default"]
    print(f"setup: {len(config.targets)} prompts x {args.tokens} tokens x batch sizes {args.batch_sizes}, "
          f"placement {_placement(config)}, {platform.processor() or platform.machine()}")
    print(f"wall time: {wall:.1f} s (probe, model loaded)")
    print(f"generate calls: {calls}, compared streams: {m['n_runs']}, decode steps: {steps}")
    print(f"time per decode step: {1000 * wall / steps:.2f} ms")
    print(f"prompts whose tokens differ: {m.get('prompts_diverged', '-')} of {m.get('n_prompts', 1)}; "
          f"first token divergence {m['first_token_divergence']}, numeric {m['first_numeric_divergence']}")
    print(f"for comparison (same kind of machine): detLLM {DETLLM_SECONDS} s, "
          f"nondet gate before {GATE_SECONDS} s")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--prompts", type=int, default=len(DEMO_PROMPTS), help="the first N built-in prompts")
    p.add_argument("--placement", default=None, help="default: the tree's own default for several prompts")
    p.add_argument("--gpu", action="store_true", help="the GPU case instead (CUDA)")
    p.add_argument("--compile", action="store_true", help="with --gpu: decode on the compiled path")
    p.add_argument("--modes", default="default,batch-invariant", help="with --gpu --compile: the kernels modes")
    p.add_argument("--no-mask-runs", action="store_true",
                   help="the mode's masked attention tiles load their mask instead of testing runs (ops.MASK_RUNS)")
    return p.parse_args()


def _main_gpu(args) -> None:
    """The GPU case: default kernels and the mode, each timed on its own after a warm-up."""
    import torch

    model = ModelSpec(name=str(default_model_dir(GPU_CASE)), device="cuda")
    sizes, tokens = (1, 2, 4, 8, 16, 32, 64, 128), 200
    if args.no_mask_runs:
        from nondet.kernels import ops

        ops.MASK_RUNS = False
    if args.compile:
        return _main_gpu_compiled(model, sizes, tokens, tuple(args.modes.split(",")))
    step_ms = {}
    print(f"setup: 1 prompt x {tokens} tokens x batch sizes {sizes}, target at both ends, "
          f"{torch.cuda.get_device_name()}, random Qwen3 hidden 1024 x 8 layers bf16")
    print("| kernels | wall s | before the row plan (H200) | speedup | runs | generate calls | decode steps | "
          "ms per step | distinct completions |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in ("default", "batch-invariant"):
        _gpu_probe(model, mode, (1, 2), 8)  # warm-up: Triton compiles, CUDA allocates; untimed
        started = time.perf_counter()
        result = _gpu_probe(model, mode, sizes, tokens)
        wall = time.perf_counter() - started
        calls, steps = _calls_and_steps(result.run_dir)
        m = result.summary["modes"][mode]
        print(f"| {mode} | {wall:.1f} | {GPU_SECONDS[mode]} | {GPU_SECONDS[mode] / wall:.2f}x | {m['n_runs']} | "
              f"{calls} | {steps} | {1000 * wall / steps:.2f} | {m['distinct_completions']} |")
        started = time.perf_counter()  # batch 1 alone: the step the roofline is for
        result = _gpu_probe(model, mode, (1,), tokens)
        step_ms[mode] = 1000 * (time.perf_counter() - started) / _calls_and_steps(result.run_dir)[1]
    _print_roofline(model, tokens, step_ms)


def _main_gpu_compiled(model: ModelSpec, sizes, tokens, modes=("default", "batch-invariant")) -> None:
    """The GPU case on the compiled path: per mode, compile + warm-up apart from the decoding."""
    import torch

    print(f"setup: 1 prompt x {tokens} tokens x batch sizes {sizes}, target at both ends, compiled path, "
          f"{torch.cuda.get_device_name()}, random Qwen3 hidden 1024 x 8 layers bf16")
    print("| kernels | path | wall s | compile + warm-up s | decoding s | eager on an H200 s | speedup of the "
          "decoding | decode steps | ms per step | distinct completions | first numeric divergence |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in modes:
        started = time.perf_counter()
        result = _gpu_probe(model, mode, sizes, tokens, compile_backend="inductor")
        wall = time.perf_counter() - started
        path = result.summary["decode_path"]["modes"][mode]
        _, steps = _calls_and_steps(result.run_dir)
        m = result.summary["modes"][mode]
        eager = EAGER_H200_SECONDS[mode]
        print(f"| {mode} | {path['path']} | {wall:.1f} | {path['warmup_s']:.1f} | {path['measured_s']:.2f} | {eager} "
              f"| {eager / path['measured_s']:.1f}x | {steps} | {1000 * path['measured_s'] / steps:.2f} | "
              f"{m['distinct_completions']} | {m['first_numeric_divergence']} |", flush=True)


def _gpu_probe(model: ModelSpec, mode: str, sizes, tokens, compile_backend: str | None = None):
    out = Path(tempfile.mkdtemp(prefix="nondet-bench-gpu-")) / "run"
    config = ProbeConfig(model=model, batch_sizes=sizes, max_new_tokens=tokens, placement="ends",
                         kernels=(mode,), out=str(out), compile_backend=compile_backend)
    return run_probe(config)


def _print_roofline(model: ModelSpec, tokens: int, step_ms: dict) -> None:
    """Batch-1 decode step lower bound: every weight byte and the KV cache read once from HBM."""
    import torch

    loaded = load_model(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    cfg = loaded.model.config
    context = len(loaded.tokenizer(ProbeConfig().prompt)["input_ids"]) + tokens  # the last step's KV length
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * context  # K and V, bf16
    name = torch.cuda.get_device_name()
    bandwidth = next((bw for key, bw in HBM_BYTES_PER_S.items() if key in name), None)
    if bandwidth is None:
        print(f"roofline: no HBM bandwidth on record for {name}")
        return
    roof_ms = 1000 * (weight_bytes + kv_bytes) / bandwidth
    print(f"roofline at batch 1: ({weight_bytes / 1e6:.1f} MB weights + {kv_bytes / 1e6:.2f} MB KV) / "
          f"{bandwidth / 1e12:.2f} TB/s = {1000 * roof_ms:.1f} us per step; measured at batch 1 (probe wall time / "
          f"steps) " + ", ".join(f"{k} {v:.2f} ms = {v / roof_ms:.0f}x" for k, v in step_ms.items()))


def _config(args) -> ProbeConfig:
    sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    extra = {"placement": args.placement} if args.placement else {}
    out = Path(tempfile.mkdtemp(prefix="nondet-bench-")) / "run"
    return ProbeConfig(prompts=DEMO_PROMPTS[:args.prompts], model=ModelSpec(), batch_sizes=sizes,
                       max_new_tokens=args.tokens, out=str(out), **extra)


def _placement(config) -> str:
    if config.placement != "auto":
        return config.placement
    return "auto (rows)" if len(config.targets) > 1 and config.runs is None else "auto (ends)"


def _calls_and_steps(run_dir) -> tuple[int, int]:
    """Generate calls (conditions) and decode steps: per call, its longest stream's steps."""
    longest: dict[str, int] = {}
    for line in (Path(run_dir) / "streams.jsonl").read_text().splitlines():
        s = json.loads(line)
        longest[s["condition_id"]] = max(longest.get(s["condition_id"], 0), len(s["steps"]))
    return len(longest), sum(longest.values())


if __name__ == "__main__":
    main()
