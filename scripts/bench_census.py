"""What the op census costs: its one-time time per model, and the decode step before and after it.

    python3 scripts/bench_census.py [--layers 36] [--moe] [--tiny]

The census (nondet/kernels/census.py) runs one short forward under the mode and one with default
kernels, once per model class and config, when the mode is first entered. This prints, per model
(an 8B-shaped Qwen3 and, with --moe, a Qwen3-30B-A3B-shaped MoE; --tiny: small CPU shapes): the
census's time eager and for the compiled path, its counts, its logit check, and the eager decode
step's median time at B = 1 under the mode entered with the census (cached after the first entry)
and without it (`_census=False`): the two must match within noise, as the census runs once.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "device"))
from gpu_compile import build, build_moe  # noqa: E402  (the 8B-shaped and MoE builders)


def tiny(moe: bool):
    import transformers as tf

    common = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, intermediate_size=256)
    config = (tf.Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)
              if moe else tf.Qwen3Config(**common))
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def timed(fn) -> tuple[float, object]:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def step_ms(model, census: bool, steps: int = 20) -> float:
    """Median eager decode step (B = 1, 64 cached tokens) under the mode, entered with or without census."""
    from nondet.kernels import batch_invariant
    from nondet.kernels.census import cache_argument

    device = next(model.parameters()).device
    ids = torch.arange(64, device=device).reshape(1, 64) + 3
    times = []
    with torch.no_grad(), batch_invariant(model=model, _census=census):
        cache = cache_argument(model, model(input_ids=ids, use_cache=True))
        token = ids[:, -1:]
        for _ in range(steps):
            seconds, _ = timed(lambda: model(input_ids=token, use_cache=True, **cache))
            times.append(seconds * 1e3)
    return statistics.median(times[3:])


def row(name: str, model) -> list[str]:
    from nondet.kernels import census
    from nondet.kernels.mode import census_of

    with census.cleared():
        eager_s, found = timed(lambda: census_of(model))
        compiled_s, compiled = timed(lambda: census_of(model, compiled=True))
        with_census = step_ms(model, True)
    without = step_ms(model, False)
    counts = found.counts()
    return [name, f"{eager_s:.2f}", f"{compiled_s:.2f}", str(counts["routed"]), str(counts["row-independent"]),
            str(counts["uncovered"] + compiled.counts()["uncovered"]), f"{found.max_logit_diff:.3g}/{found.tolerance:.3g}",
            f"{with_census:.2f}", f"{without:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--moe", action="store_true", help="also the Qwen3-30B-A3B-shaped MoE")
    parser.add_argument("--tiny", action="store_true", help="small CPU shapes (a smoke run)")
    args = parser.parse_args()
    models = [("qwen3-tiny", lambda: tiny(False))] + ([("qwen3-moe-tiny", lambda: tiny(True))] if args.moe else [])
    if not args.tiny:
        models = [(f"qwen3-8B-shape x{args.layers}", lambda: build(args.layers))]
        if args.moe:
            models.append(("qwen3-30B-A3B-shape x8", lambda: build_moe(8)))
    header = ["model", "census s", "compiled census s", "routed", "row-indep.", "uncovered", "logit diff/allowed",
              "step ms (census)", "step ms (none)"]
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header), flush=True)
    for name, make in models:
        model = make()
        print("| " + " | ".join(row(name, model)) + " |", flush=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
