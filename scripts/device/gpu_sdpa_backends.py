"""Eager decode on CUDA by SDPA backend: where a dynamic-cache generate step's time goes.

    python3 scripts/device/gpu_sdpa_backends.py [--tokens 200] [--batches 1,128]

The probe's GPU case (scripts/bench_probe.py's GPU_CASE: a random Qwen3, hidden 1024 x 8 layers) decodes
greedy with transformers' generate on its dynamic KV cache, as an eager `nondet probe` does, once with SDPA
choosing its backend as torch does by default and once per restricted set (torch.nn.attention.sdpa_kernel).
A dynamic cache grows by one position a step, so every step is a new attention shape. Prints ms per step and
whether the tokens and the last step's logits are the bits of the unrestricted run: a backend that is
faster but rounds otherwise is another kernel, not the default one.
"""

import argparse
import sys
from contextlib import nullcontext
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: bench_probe's GPU_CASE

BACKENDS = {  # name -> the SDPA backends allowed (None: torch's own choice)
    "torch's choice": None,
    "no cuDNN": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
    "cuDNN only": ("CUDNN_ATTENTION",),
    "flash only": ("FLASH_ATTENTION",),
}


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench_probe import GPU_CASE
    from nondet.probes.models.default_model import default_model_dir
    from nondet.probes.models.loading import ModelSpec, load_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--batches", default="1,128")
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
            base = base or (tokens, logits)
            print(f"| {b} | {name} | {ms:.2f} | {torch.equal(tokens, base[0])} | {torch.equal(logits, base[1])} |",
                  flush=True)


def _generate(model, batch, tokens: int):
    import torch

    with torch.no_grad():
        return model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)


if __name__ == "__main__":
    main()
