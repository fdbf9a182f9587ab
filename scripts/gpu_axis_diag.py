"""Which module first breaks the mode on the speculative and trainer axes (device diagnostic).

Under batch_invariant(model=...), the same n positions of one prompt are computed three ways:
  decode   prefill(P), then n one-token decodes (Q = 1 each): plain greedy decoding
  chunk    prefill(P), then one forward of the n tokens (Q = n): a speculative verification
  prefill  one forward over P + n tokens, no cache (Q = P + n): a trainer's teacher forcing
Every module's output for those positions is captured; the first module (execution order)
whose bits differ from `decode` is printed per way (with default kernels too: the positive
control). Usage: python scripts/gpu_axis_diag.py [cuda|cpu]
"""

import contextlib
import sys

import torch

from nondet.kernels import batch_invariant
from nondet.probes.loading import ModelSpec, load_model


def capture(model, run) -> dict[str, list[torch.Tensor]]:
    """{module name: [output tensors of each call]} while run() executes."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, module in model.named_modules():
        def hook(_m, _i, out, name=name):
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, torch.Tensor) and t.dim() >= 2:
                seen.setdefault(name, []).append(t.detach().clone())
        hooks.append(module.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def last_rows(calls: list[torch.Tensor], n: int) -> torch.Tensor | None:
    """The last n positions (dim 1) of the concatenated calls; None if shapes do not allow it."""
    try:
        t = torch.cat(calls, dim=1) if len(calls) > 1 else calls[0]
        return t[:, -n:] if t.shape[1] >= n else None
    except (RuntimeError, IndexError):
        return None


def main(device: str) -> None:
    for mode in ("batch-invariant", "default"):
        print(f"kernels: {mode}", flush=True)
        compare_ways(device, mode)


def compare_ways(device: str, mode: str) -> None:
    loaded = load_model(ModelSpec(device=device))
    model, tok = loaded.model, loaded.tokenizer
    prompt = tok("Tell me about Richard Feynman", return_tensors="pt").input_ids.to(device)
    n = int(__import__("os").environ.get("DIAG_TOKENS", "6"))
    k = 5  # tokens per verification chunk
    with torch.inference_mode():
        forced = model.generate(prompt, max_new_tokens=n, do_sample=False)[:, prompt.shape[1]:]
    with batch_invariant(model=model) if mode == "batch-invariant" else contextlib.nullcontext():
        p = prompt.shape[1]

        def ones(length):  # generate passes an attention mask; so do we
            return torch.ones((1, length), dtype=torch.long, device=device)

        def decode():
            cache = model(prompt, attention_mask=ones(p), use_cache=True).past_key_values
            for i in range(n):
                cache = model(forced[:, i:i + 1], attention_mask=ones(p + i + 1), past_key_values=cache,
                              use_cache=True).past_key_values

        def chunk():  # verification rounds of k tokens each, as assisted decoding runs them
            cache = model(prompt, attention_mask=ones(p), use_cache=True).past_key_values
            for i in range(0, n, k):
                cache = model(forced[:, i:i + k], attention_mask=ones(p + min(i + k, n)), past_key_values=cache,
                              use_cache=True).past_key_values

        def prefill():
            model(torch.cat([prompt, forced], dim=1), use_cache=False)

        ref = capture(model, decode)
        for label, run in (("chunk (speculative)", chunk), ("prefill (trainer)", prefill)):
            other = capture(model, run)
            first = None
            for name in ref:  # execution order of first calls
                a, b = last_rows(ref[name][1:], n), last_rows(other.get(name, []), n) if name in other else None
                if label.startswith("chunk") and name in other:
                    b = last_rows(other[name][1:], n)
                if a is None or b is None or a.shape != b.shape:
                    continue
                if not torch.equal(a, b):
                    diff = (a.float() - b.float()).abs().max().item()
                    rows = (a != b).flatten(2).any(-1)[0].nonzero().flatten().tolist()
                    first = f"{name}: max |diff| {diff:.3g}, differing positions {rows}"
                    break
            print(f"  {label}: first differing module: {first or 'none (bit-identical)'}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda")
