"""Eager decode on CUDA by SDPA backend: where a dynamic-cache generate step's time goes.

    python3 scripts/device/gpu_sdpa_backends.py [--tokens 200] [--batches 1,128]

The probe's GPU case (scripts/bench_probe.py's GPU_CASE: a random Qwen3, hidden 1024 x 8 layers) decodes
greedy with transformers' generate on its dynamic KV cache, as an eager `nondet probe` does, once with SDPA
choosing its backend as torch does by default and once per restricted set (torch.nn.attention.sdpa_kernel).
A dynamic cache grows by one position a step, so every step is a new attention shape; the first run of each
batch size meets every shape first (cuDNN builds an attention graph per shape), the later ones find them
built. Prints ms per step and whether the tokens and the last step's logits are the bits of torch's own
choice: a backend that is faster but rounds otherwise is another kernel, not the default one.
"""

import argparse
import sys
from contextlib import nullcontext
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: bench_probe's GPU_CASE

BACKENDS = {  # name -> the SDPA backends allowed (None: torch's own choice); the first runs at shapes new to the process
    "cuDNN only, first": ("CUDNN_ATTENTION",),
    "torch's choice": None,
    "every backend, listed": ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
    "no cuDNN": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
    "cuDNN only": ("CUDNN_ATTENTION",),
    "flash only": ("FLASH_ATTENTION",),
    "efficient only": ("EFFICIENT_ATTENTION",),
    "math only": ("MATH",),
    "torch's choice, again": None,
}
PROFILED = ("torch's choice", "cuDNN only")  # --profile: host ops of a short generate under each


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench_probe import GPU_CASE
    from nondet.probes.models.default_model import default_model_dir
    from nondet.probes.models.loading import ModelSpec, load_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--batches", default="1,128")
    parser.add_argument("--profile", action="store_true", help="the host ops with the most self time, 16 steps")
    args = parser.parse_args()
    loaded = load_model(ModelSpec(name=str(default_model_dir(GPU_CASE)), device="cuda"))
    model, tok = loaded.model, loaded.tokenizer
    print(f"model dtype {model.dtype}, attention {model.config._attn_implementation}, torch {torch.__version__}")
    ids = tok("Tell me about Richard Feynman", return_tensors="pt")["input_ids"].to("cuda")
    print("| batch | backends | ms per step | tokens = torch's choice | last logits = torch's choice |")
    print("| --- | --- | --- | --- | --- |")
    for b in (int(x) for x in args.batches.split(",")):
        batch = ids.repeat(b, 1)
        base = None
        for name, allowed in BACKENDS.items():
            scope = sdpa_kernel([getattr(SDPBackend, a) for a in allowed]) if allowed else nullcontext()
            try:
                with scope:
                    _generate(model, batch, 4)  # first-call costs apart
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    out = _generate(model, batch, args.tokens)
                    torch.cuda.synchronize()
                    ms = (time.perf_counter() - started) * 1e3 / args.tokens
            except RuntimeError as exc:  # a backend that cannot take this shape
                print(f"| {b} | {name} | not run: {str(exc).splitlines()[0][:80]} | | |")
                continue
            tokens, logits = out.sequences, out.scores[-1]
            if allowed is None and base is None:
                base = (tokens, logits)
            same = (torch.equal(tokens, base[0]), torch.equal(logits, base[1])) if base else ("-", "-")
            print(f"| {b} | {name} | {ms:.2f} | {same[0]} | {same[1]} |", flush=True)
    if args.profile:
        for name in PROFILED:
            _profile(model, ids, name, BACKENDS[name])


def _profile(model, ids, name: str, allowed) -> None:
    """The host ops with the most self CPU time in a 16-step generate at batch 1 under `allowed`."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    scope = sdpa_kernel([getattr(SDPBackend, a) for a in allowed]) if allowed else nullcontext()
    with scope:
        _generate(model, ids, 4)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _generate(model, ids, 16)
    print(f"\n== {name}: host ops by self CPU time, 16 steps at batch 1")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))


def _generate(model, batch, tokens: int):
    import torch

    with torch.no_grad():
        return model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)


if __name__ == "__main__":
    main()
