"""The cost of true on-policy RL: trainer forward+backward step time, batch-invariant mode vs default kernels.

    python scripts/bench_rl.py                  # the GPU case: random Qwen3 hidden 1024 x 8 layers bf16,
                                                # micro-batch 1/4/8 x (32 prompt + 256 completion) tokens
    python scripts/bench_rl.py --tiny           # a tiny model on the CPU (the CI smoke test)
    python scripts/bench_rl.py --compile        # the forward through torch.compile (Inductor), both kernels

One trainer step is what `nondet rl`'s trainer side does per micro-batch: model.train() with
dropout 0, a teacher-forced forward over prompt + completion, fp32 log-softmax of the logits
that predict the completion, loss = -mean(logprob of the given tokens), loss.backward(). Each
(micro-batch, kernels) is timed after warm-up steps (Triton compiles on the first), as the
median of --reps steps, synchronized on CUDA. Prints one row per micro-batch: step times and
the throughput ratio default / batch-invariant time (target: >= 0.7x). With --compile the model's
forward is torch.compile'd (Inductor, a fresh compile per kernels mode and micro-batch; the mode
traceable, its ops with backward formulas: kernels/custom_grads.py); the first step, compile
included, is reported apart.
The model is built in code with seeded random weights (like nondet/probes/models/default_model.py):
nothing is downloaded; only its shapes matter for time.
"""

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass

TARGET_RATIO = 0.7  # target: the mode's trainer throughput at least 0.7x the default kernels'


@dataclass(frozen=True)
class BenchConfig:
    hidden: int = 1024  # the GPU case
    layers: int = 8
    heads: int = 16  # head dim 64
    kv_heads: int = 8  # GQA, as Qwen3
    intermediate: int = 3072  # 3 x hidden, as Qwen3's small models
    vocab: int = 151936  # Qwen3's vocabulary: the lm_head and the log-softmax over it are part of a step
    dtype: str = "bfloat16"
    device: str = "cuda"
    micro_batches: tuple[int, ...] = (1, 4, 8)
    prompt_tokens: int = 32
    completion_tokens: int = 256  # 256 sampled tokens, as in the GPU case
    warmup: int = 2  # untimed steps first: Triton's compile, cuBLAS's heuristics, the allocator
    reps: int = 5  # timed steps; the median is reported
    seed: int = 0
    compile: bool = False  # the forward through torch.compile (Inductor)
    compile_mode: str | None = None  # torch.compile's mode, e.g. "reduce-overhead" (CUDA graphs)
    profile: bool = False  # after timing, one more step under the profiler: GPU time by kernel


TINY = BenchConfig(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512, dtype="float32",
                   device="cpu", micro_batches=(1, 4, 8), prompt_tokens=8, completion_tokens=8, warmup=1, reps=1)


def build_model(c: BenchConfig):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(c.seed)
    config = Qwen3Config(vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=c.intermediate,
                         num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
                         head_dim=c.hidden // c.heads, max_position_embeddings=4096, attention_dropout=0.0)
    config._attn_implementation = "sdpa"  # the default kernels' attention; the mode swaps in its own
    return Qwen3ForCausalLM(config).to(device=c.device, dtype=getattr(torch, c.dtype))


def trainer_step(model, forward, ids, prompt_tokens: int) -> None:
    """One RL trainer step on ids [mb, P + C]: forward, logprobs of the completion's tokens, backward."""
    import torch

    from nondet.probes.rl.trainer import backward

    logits = forward(input_ids=ids, use_cache=False).logits  # [mb, T, vocab]
    targets = ids[:, prompt_tokens:]  # the completion tokens, predicted by the logits one before
    lp = torch.log_softmax(logits[:, prompt_tokens - 1:-1].float(), -1).gather(-1, targets[..., None])
    backward(model, lp.flatten())


def time_steps(model, ids, mode: str, c: BenchConfig) -> tuple[float, float]:
    """(median seconds of one trainer step, seconds of the first step) under a kernels mode."""
    import torch

    from nondet.probes.rl.trainer import training
    from nondet.probes.core.kernels_mode import kernels_mode

    forward = model.forward
    if c.compile:
        torch._dynamo.reset()  # a fresh compile: no graph of the other kernels mode is reused
        forward = torch.compile(model.forward, mode=c.compile_mode)
    times = []
    with training(model), kernels_mode(mode, model, traceable=c.compile):
        for _ in range(c.warmup + c.reps):
            _sync(c)
            started = time.perf_counter()
            trainer_step(model, forward, ids, c.prompt_tokens)
            _sync(c)
            times.append(time.perf_counter() - started)
        if c.profile:
            _profile(model, forward, ids, mode, c)
    return statistics.median(times[c.warmup:]), times[0]


def _profile(model, forward, ids, mode: str, c: BenchConfig, top: int = 12) -> None:
    """Print one step's GPU time by kernel (where the mode's step goes, against the default's)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trainer_step(model, forward, ids, c.prompt_tokens)
        _sync(c)
    from torch.autograd import DeviceType

    kernels = sorted((e for e in prof.key_averages() if e.device_type == DeviceType.CUDA),
                     key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in kernels)  # us
    print(f"profile {mode}, micro-batch {ids.shape[0]}: {total / 1e3:.2f} ms of GPU kernel time in one step")
    for e in kernels[:top]:
        print(f"  {e.self_device_time_total / 1e3:8.2f} ms {e.count:5d}x  {e.key[:110]}")


def _sync(c: BenchConfig) -> None:
    if c.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def bench(c: BenchConfig) -> list[dict]:
    import torch

    model = build_model(c)
    g = torch.Generator().manual_seed(c.seed)
    rows = []
    for mb in c.micro_batches:
        ids = torch.randint(0, c.vocab, (mb, c.prompt_tokens + c.completion_tokens), generator=g).to(c.device)
        default, default_first = time_steps(model, ids, "default", c)
        invariant, invariant_first = time_steps(model, ids, "batch-invariant", c)
        rows.append({"micro_batch": mb, "tokens": int(ids.numel()), "default_ms": default * 1e3,
                     "batch_invariant_ms": invariant * 1e3, "throughput_ratio": default / invariant,
                     "default_first_s": default_first, "batch_invariant_first_s": invariant_first})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'micro-batch':>11} {'tokens':>7} {'default ms':>11} {'batch-invariant ms':>19} {'throughput':>11}"
             f" {'first step s (default / mode)':>30}"]
    for r in rows:
        first = f"{r['default_first_s']:.1f} / {r['batch_invariant_first_s']:.1f}"
        lines.append(f"{r['micro_batch']:>11} {r['tokens']:>7} {r['default_ms']:>11.2f} "
                     f"{r['batch_invariant_ms']:>19.2f} {r['throughput_ratio']:>10.2f}x {first:>30}")
    return "\n".join(lines)


def device_name(c: BenchConfig) -> str:
    if c.device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return f"CPU {platform.processor() or platform.machine()}"


def main() -> None:
    args = _parse()
    c = TINY if args.tiny else BenchConfig()
    if args.micro_batch:
        c = BenchConfig(**{**asdict(c), "micro_batches": tuple(int(x) for x in args.micro_batch.split(","))})
    if args.compile or args.compile_mode or args.profile:
        c = BenchConfig(**{**asdict(c), "compile": args.compile or bool(args.compile_mode),
                           "compile_mode": args.compile_mode, "profile": args.profile})
    import torch

    if c.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("bench_rl: no CUDA device; run with --tiny for the CPU smoke run")
    rows = bench(c)
    print(f"setup: random Qwen3 hidden {c.hidden} x {c.layers} layers {c.dtype}, vocab {c.vocab}, "
          f"{c.prompt_tokens} prompt + {c.completion_tokens} completion tokens per sequence, "
          f"median of {c.reps} steps after {c.warmup} warm-up; {device_name(c)}, torch {torch.__version__}")
    path = f"torch.compile'd forward (Inductor{', ' + c.compile_mode if c.compile_mode else ''})" if c.compile else "eager"
    print(f"trainer step = forward + fp32 log-softmax + backward (model.train(), dropout 0); {path}")
    print(table(rows))
    worst = min(r["throughput_ratio"] for r in rows)
    print(f"throughput ratio = default / batch-invariant step time; worst {worst:.2f}x "
          f"({'meets' if worst >= TARGET_RATIO else 'misses'} the >= {TARGET_RATIO}x target)")
    if args.json:
        print(json.dumps({"config": asdict(c), "rows": rows}))


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="a tiny fp32 model on the CPU (CI smoke run)")
    p.add_argument("--micro-batch", help="micro-batch sizes, e.g. 1,4,8 (default: 1,4,8)")
    p.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    p.add_argument("--compile", action="store_true", help="the forward through torch.compile (Inductor)")
    p.add_argument("--compile-mode", help="torch.compile mode (implies --compile), e.g. reduce-overhead")
    p.add_argument("--profile", action="store_true", help="print one step's GPU time by kernel per kernels mode")
    return p.parse_args()


if __name__ == "__main__":
    main()
