"""Where a batch-1 decode step's host time goes under the mode (issue 17: 22 ms vs 10 ms default).

    python scripts/gpu_profile_decode.py        # CUDA; issue 17's GPU case model, 64 greedy tokens

Runs generate once untimed (compiles), then under cProfile, for default kernels and the mode,
and prints the wall time per step and the 18 functions with the most own time (tottime) under
the mode: the per-launch Python work (dispatch, launchers, checks) that CUDA graphs would remove.
"""

import contextlib
import cProfile
import io
import pstats
import time

import torch

from nondet.kernels import batch_invariant
from nondet.probes.default_model import DefaultModelSpec, default_model_dir
from nondet.probes.loading import ModelSpec, load_model

CASE = DefaultModelSpec(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=64)
TOKENS = 64


def generate(model, ids):
    return model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)


def main() -> None:
    loaded = load_model(ModelSpec(name=str(default_model_dir(CASE)), device="cuda"))
    model = loaded.model
    ids = loaded.tokenizer("Tell me about Richard Feynman", return_tensors="pt").input_ids.cuda()
    for mode in ("default", "batch-invariant"):
        ctx = batch_invariant(model=model) if mode != "default" else contextlib.nullcontext()
        with ctx:
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
