"""Where a decode step's time goes, default kernels vs the mode (issue 17: 22 ms vs 10 ms at batch 1).

    python scripts/gpu_profile_decode.py        # CUDA; issue 17's GPU case model, 64 greedy tokens

First a table: the step time of plain greedy `generate` (no profiler) per batch size 1, 8, 32, 128
(the same prompt in every row), default kernels vs the mode; bench_probe --gpu saw default
kernels average 82 ms a step over batch sizes 1-128 where the mode took 22, and this says at
which batch size. Then generate at batch 1 under cProfile, for both, with the 18 functions with
the most own time (tottime) under the mode: the per-launch Python work (dispatch, launchers,
checks) that CUDA graphs would remove.
"""

import contextlib
import cProfile
import io
import pstats
import time

import torch

from bench_probe import GPU_CASE  # scripts/ is on sys.path when this runs as a script
from nondet.kernels import batch_invariant
from nondet.probes.default_model import default_model_dir
from nondet.probes.loading import ModelSpec, load_model
TOKENS = 64


def generate(model, ids):
    return model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)


def scope(mode, model):
    return batch_invariant(model=model) if mode != "default" else contextlib.nullcontext()


def step_table(model, ids) -> None:
    print("| batch | default ms per step | batch-invariant ms per step |")
    print("| ---: | ---: | ---: |")
    for batch in (1, 8, 32, 128):
        rows = ids.expand(batch, -1).contiguous()
        ms = []
        for mode in ("default", "batch-invariant"):
            with scope(mode, model):
                generate(model, rows)  # warm
                torch.cuda.synchronize()
                started = time.perf_counter()
                generate(model, rows)
                torch.cuda.synchronize()
                ms.append(1000 * (time.perf_counter() - started) / TOKENS)
        print(f"| {batch} | {ms[0]:.2f} | {ms[1]:.2f} |")


def main() -> None:
    loaded = load_model(ModelSpec(name=str(default_model_dir(GPU_CASE)), device="cuda"))
    model = loaded.model
    ids = loaded.tokenizer("Tell me about Richard Feynman", return_tensors="pt").input_ids.cuda()
    step_table(model, ids)
    for mode in ("default", "batch-invariant"):
        with scope(mode, model):
            generate(model, ids)  # warm: Triton compiles, cuBLAS picks
            torch.cuda.synchronize()
            profiler = cProfile.Profile()
            started = time.perf_counter()
            profiler.enable()
            generate(model, ids)
            torch.cuda.synchronize()
            profiler.disable()
            wall = time.perf_counter() - started
        print(f"{mode}: {1000 * wall / TOKENS:.2f} ms per step (cProfile on, {TOKENS} steps)")
        if mode != "default":
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
            print("\n".join(line[:150] for line in text.getvalue().splitlines()[6:30]))


if __name__ == "__main__":
    main()
