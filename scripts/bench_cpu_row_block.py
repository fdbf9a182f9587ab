"""The mode's CPU matmul by row block: a decode step and a prefill of a SmolLM2-135M-shaped model, per CPU_ROW_BLOCK.

    python scripts/bench_cpu_row_block.py [--blocks 16,8,4] [--batches 1,4] [--prompt 48] [--dtype float32]

Under the mode every CPU matmul row is computed inside a call of exactly CPU_ROW_BLOCK rows
(nondet/kernels/cpu.py), so a batch-1 decode step multiplies CPU_ROW_BLOCK rows through every weight and a
prefill of T tokens makes ceil(T / CPU_ROW_BLOCK) calls. A random Qwen3 with the demo model's widths
(hidden 576, MLP 1536, 30 layers, 9 heads / 3 KV heads, vocabulary 49152) built in code; per block: ms per decode
step at each batch size (16 steps after the prompt) and ms for the prompt's prefill, the least of --repeats runs
(a busy host's noise only adds). The default kernels' figures are the floor. Speed only: the row checks of every
block are tests/test_kernels_cpu.py's.
"""

import argparse
import time


def main() -> None:
    import torch

    import nondet.kernels.cpu as cpu
    from nondet.kernels import batch_invariant
    from nondet.probes.models.default_model import DefaultModelSpec, default_model_dir
    from nondet.probes.models.loading import ModelSpec, load_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", default="16,8,4")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    spec = DefaultModelSpec(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    model = load_model(ModelSpec(name=str(default_model_dir(spec)), dtype=args.dtype)).model
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    batches = [int(b) for b in args.batches.split(",")]
    print("| kernels | block | " + " | ".join(f"decode B = {b}, ms a step" for b in batches)
          + f" | prefill {args.prompt} tokens, ms |")
    print("| --- | --- | " + " | ".join("---" for _ in batches) + " | --- |")
    print(_row("default", "-", model, batches, args))
    for block in (int(b) for b in args.blocks.split(",")):
        cpu.CPU_ROW_BLOCK = block  # read at each call (cpu.py's module global)
        with batch_invariant(model=model):
            print(_row("batch-invariant", str(block), model, batches, args), flush=True)


def _row(kernels: str, block: str, model, batches: list[int], args) -> str:
    decode = [min(_decode_ms(model, b, args) for _ in range(args.repeats)) for b in batches]
    prefill = min(_prefill_ms(model, args.prompt) for _ in range(args.repeats))
    return f"| {kernels} | {block} | " + " | ".join(f"{ms:.1f}" for ms in decode) + f" | {prefill:.1f} |"


def _prefill_ms(model, tokens: int) -> float:
    import torch

    ids = torch.arange(1, tokens + 1).unsqueeze(0)
    with torch.no_grad():
        started = time.perf_counter()
        model(ids, use_cache=True)
        return (time.perf_counter() - started) * 1e3


def _decode_ms(model, batch: int, args) -> float:
    """ms per decode step: a prompt of args.prompt tokens at `batch`, then args.steps one-token steps."""
    import inspect

    import torch

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in 5.2x
    ids = torch.arange(1, args.prompt + 1).repeat(batch, 1)
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        started = time.perf_counter()
        for _ in range(args.steps):
            out = model(token, use_cache=True, **{name: cache})
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return (time.perf_counter() - started) * 1e3 / args.steps


if __name__ == "__main__":
    main()
