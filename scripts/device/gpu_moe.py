"""A mixture of experts of realistic width on CUDA: Qwen3-30B-A3B-shaped layers (hidden 2048, 128
experts, top-8, expert width 768, 32 / 4 heads of 128), 4 layers, random bf16 weights.

    python3 scripts/device/gpu_moe.py [--layers 4] [--tokens 64] [--out DIR] [--timing]

1. `nondet probe --confirm` over batch sizes 1..64 (one prompt at both ends of each batch): default
   kernels' distinct completions and first divergence, and the mode's (must be 1 distinct, identical bits);
2. `nondet bisect` on the default kernels' run: routing change or arithmetic, origin, minimal set;
3. decode step time, default kernels vs the mode, at B = 1 and B = 32 (HF generate, eager, greedy).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT = "Tell me about Richard Feynman and his work on quantum electrodynamics."


def build(path: Path, layers: int) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from nondet.probes.models.default_model import build_tokenizer

    if (path / "config.json").exists():
        return
    tokenizer = build_tokenizer(2048)
    tokenizer.save_pretrained(path)
    cfg = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=6144,
                         moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=4, head_dim=128, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=4096, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else None
    model.save_pretrained(path)


def nondet(*args: str, timeout: int, head: bool = False) -> None:
    """Run a nondet command; print its first (head) or last 45 lines."""
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "nondet", *args], capture_output=True, text=True, timeout=timeout)
        lines = [l for l in (proc.stdout + proc.stderr).splitlines() if "Writing" not in l and "Loading" not in l]
        print("\n".join(lines[:45] if head else lines[-45:]))
        print(f"[nondet {args[0]}: exit {proc.returncode}, {time.perf_counter() - started:.1f} s]", flush=True)
    except subprocess.TimeoutExpired:
        print(f"[nondet {args[0]}: timed out after {timeout} s]", flush=True)


def step_ms(model, tokenizer, batch: int, tokens: int, invariant: bool) -> float:
    from nondet.kernels import batch_invariant

    ids = tokenizer([PROMPT] * batch, return_tensors="pt").input_ids.cuda()
    scope = batch_invariant(model=model) if invariant else torch.no_grad()

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       pad_token_id=tokenizer.pad_token_id)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with scope, torch.no_grad():
        run(4)  # warm-up (Triton compiles)
        return (run(tokens + 1) - run(1)) / tokens * 1e3


def timing(path: Path, tokens: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    print("| batch | default ms/step | mode ms/step | mode / default |")
    print("| ---: | ---: | ---: | ---: |")
    for batch in (1, 32):
        default = step_ms(model, tokenizer, batch, tokens, False)
        mode = step_ms(model, tokenizer, batch, tokens, True)
        print(f"| {batch} | {default:.2f} | {mode:.2f} | {mode / default:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="/tmp/nondet-moe")
    parser.add_argument("--timing", action="store_true", help="the decode step times only (3.)")
    args = parser.parse_args()
    out = Path(args.out)
    model = out / "qwen3-moe-a3b-shaped"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    build(model, args.layers)
    if args.timing:
        return timing(model, 32)
    run = out / "run"
    nondet("probe", "--model", str(model), "--device", "cuda", "-p", PROMPT, "-b", "1,2,4,8,16,32,64",
           "-n", str(args.tokens), "--confirm", "--out", str(run), timeout=300)
    nondet("bisect", str(run), timeout=240, head=True)
    timing(model, 32)


if __name__ == "__main__":
    main()
