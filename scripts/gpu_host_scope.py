"""Is the host slower at small torch calls inside the mode's scope? (A/B in one process, no profiler.)

    python3 scripts/gpu_host_scope.py [--device cuda] [--rounds 5]

The speculative case's traces showed every host op (isin, arange, cudaLaunchKernel) ~2x slower while
the mode was on, outside its compiled calls, and fast again under default kernels in the same process.
This times one loop of six small torch calls (generate's eager loop is made of such calls) outside any
scope, inside `batch_invariant()`, and inside the probe's scope (`kernels_mode` with the default model
and traceable="compiled_calls"), interleaved, `--rounds` times. `--after-decode`: then, per kernels mode,
the same loop inside the probe's scope before and right after a compiled static-cache generate of the
default model (the probe's compiled path), and outside the scope after it.
"""

import argparse
import contextlib
import statistics
import time

import torch

from nondet.kernels import batch_invariant
from nondet.probes.default_model import DefaultModelSpec, default_model_dir
from nondet.probes.loading import ModelSpec, load_model
from nondet.probes.sources.static import COMPILED_CALLS, kernels_mode


def small_calls_us(device: torch.device, loops: int = 3000) -> float:
    """Host us per loop of six small torch calls."""
    x = torch.arange(64, device=device)
    y = torch.arange(8, device=device)
    started = time.perf_counter()
    for _ in range(loops):
        torch.isin(x, y), x.view(8, 8), torch.arange(16, device=device), x.add(1), x[1:3], x.argmax()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e6 / loops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--after-decode", action="store_true", help="also around compiled generate calls")
    args = parser.parse_args()
    device = torch.device(args.device)
    loaded = load_model(ModelSpec(name=str(default_model_dir(DefaultModelSpec())), device=args.device))
    model = loaded.model
    scopes = {"no scope": contextlib.nullcontext, "batch_invariant()": batch_invariant,
              "the probe's scope": lambda: kernels_mode("batch-invariant", model, traceable=COMPILED_CALLS)}
    small_calls_us(device)  # warm-up
    times = {name: [] for name in scopes}
    for _ in range(args.rounds):
        for name, scope in scopes.items():
            with scope():
                times[name].append(small_calls_us(device))
    name = torch.cuda.get_device_name() if device.type == "cuda" else args.device
    print(f"{name} torch {torch.__version__}: host us per loop of six small torch calls (median of {args.rounds})")
    for scope, values in times.items():
        print(f"  {scope}: {statistics.median(values):.1f} us ({' '.join(f'{v:.1f}' for v in values)})")
    if args.after_decode:
        around_decodes(loaded, device, args.rounds)


def around_decodes(loaded, device: torch.device, rounds: int) -> None:
    """Per kernels mode: the loop in the probe's scope before and after a compiled generate, and after
    the scope (two warm-up generates first: compile and CUDA-graph recording)."""
    from gpu_speculative_profile import decode

    from nondet.probes.batch import tokenize_inputs
    from nondet.probes.compiled import compile_scope
    from nondet.probes.corpus import DEMO_PROMPTS

    ids = tokenize_inputs(loaded.tokenizer, DEMO_PROMPTS[0], ())[0]
    for mode in ("default", "batch-invariant"):
        times = {"in scope, before a generate": [], "in scope, after it": [], "out of scope": []}
        for r in range(rounds + 2):
            with kernels_mode(mode, loaded.model, traceable=COMPILED_CALLS), compile_scope():
                before = small_calls_us(device)
                decode(loaded.model, None, loaded.tokenizer, ids, 32, False)
                after = small_calls_us(device)
            outside = small_calls_us(device)
            if r >= 2:
                for key, value in zip(times, (before, after, outside)):
                    times[key].append(value)
        for key, values in times.items():
            print(f"  {mode}, {key}: {statistics.median(values):.1f} us ({' '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
