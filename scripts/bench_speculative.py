"""Speculative decoding under the batch-invariant mode: divergence and the cost of invariance.

    python scripts/bench_speculative.py                 # the GPU case (needs CUDA)
    python scripts/bench_speculative.py --tiny --device cpu --tokens 16 --prompts 2   # smoke run
    python scripts/bench_speculative.py --compile       # on the compiled static-cache path (probe --compile)

The GPU case: a random Qwen3 (hidden 1024, 8 layers, 16 heads / 8 KV heads, bf16) and its own
2-layer draft (its first two layers, embeddings and head: default_draft.py), both built in code.
Each of the first N built-in prompts is decoded plainly and with each speculative form, under
default kernels and under the mode (one probe with --confirm). A short warm-up probe runs
first so Triton compilation and CUDA start-up are not timed. Prints one row per form and
mode: prompts whose tokens differ from plain greedy, first divergences, acceptance, tokens/s
with and without speculation, and the speedup; then, per form, the speedup under the mode as
a fraction of the speedup under default kernels (target: >= 0.8).
"""

import argparse
import tempfile
import time
from pathlib import Path

from nondet.probes.corpus import DEMO_PROMPTS
from nondet.probes.default_draft import default_draft_dir
from nondet.probes.default_model import DefaultModelSpec, default_model_dir
from nondet.probes.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

GPU_CASE = DefaultModelSpec(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128)


def main() -> None:
    args = _parse()
    spec = DefaultModelSpec() if args.tiny else GPU_CASE
    target, draft = default_model_dir(spec), default_draft_dir(spec, layers=args.draft_layers)
    forms = tuple(f.replace("DRAFT", str(draft)) for f in args.forms.split(","))
    model = ModelSpec(name=str(target), device=args.device)
    backend = "inductor" if args.compile else None
    if not args.compile:  # the compiled path warms each condition up itself (a whole call, timed apart)
        _probe(model, forms, DEMO_PROMPTS[:1], 16, None)  # warm-up: Triton compile and allocation, untimed
    started = time.perf_counter()
    summary = _probe(model, forms, DEMO_PROMPTS[:args.prompts], args.tokens, backend)
    path = "compiled static-cache generate" if args.compile else "eager"
    print(f"setup: {args.prompts} prompts x {args.tokens} tokens, target {_describe(spec)}, "
          f"draft = its first {args.draft_layers} layers, device {args.device}, {path}; "
          f"{time.perf_counter() - started:.0f} s")
    for mode, entry in summary.get("decode_path", {}).get("modes", {}).items():
        print(f"decode path {mode}: {entry['path']}, warm-up {entry['warmup_s']:.1f} s, "
              f"measured {entry['measured_s']:.1f} s" + (f" ({entry['reason']})" if entry.get("reason") else ""))
    _print_table(summary["speculative"]["by_form"], str(draft))


def _probe(model: ModelSpec, forms, prompts, tokens, backend: str | None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="nondet-bench-spec-")) / "run"
    config = ProbeConfig(prompts=tuple(prompts), model=model, batch_sizes=(1,), max_new_tokens=tokens,
                         kernels=("default", "batch-invariant"), speculative=forms, out=str(out),
                         compile_backend=backend)
    return run_probe(config).summary


def _print_table(rows: list[dict], draft: str) -> None:
    print("| form | kernels | prompts diverged | bits differ | first token / numeric divergence | "
          "acceptance | tok/s speculative | tok/s plain | speedup |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        form = r["speculative"].replace(draft, "DRAFT")
        print(f"| {form} | {r['kernels']} | {r['prompts_diverged']} of {r['n_prompts']} | "
              f"{r['prompts_bits_differ']} | {r['first_token_divergence']} / {r['first_numeric_divergence']} | "
              f"{r['acceptance_rate']} | {r['tokens_per_s']} | {r['reference_tokens_per_s']} | {r['speedup']} |")
    for form in dict.fromkeys(r["speculative"] for r in rows):
        by = {r["kernels"]: r["speedup"] for r in rows if r["speculative"] == form}
        if by.get("default") and by.get("batch-invariant"):
            print(f"{form.replace(draft, 'DRAFT')}: speedup under the mode / speedup with default kernels = "
                  f"{by['batch-invariant'] / by['default']:.2f} (target >= 0.8)")


def _describe(spec: DefaultModelSpec) -> str:
    return (f"random Qwen3 hidden {spec.hidden_size} x {spec.num_hidden_layers} layers, "
            f"{spec.num_attention_heads}/{spec.num_key_value_heads} heads, {spec.dtype}")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--prompts", type=int, default=8, help="the first N built-in prompts")
    p.add_argument("--forms", default="draft:DRAFT:4,self:4,ngram:4", help="DRAFT = the built 2-layer draft")
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true", help="decode on the compiled static-cache path")
    p.add_argument("--tiny", action="store_true", help="the embedded default model instead of the GPU case")
    return p.parse_args()


if __name__ == "__main__":
    main()
