"""Speculative decoding under the batch-invariant mode: divergence and the cost of invariance.

    python scripts/bench_speculative.py                 # the GPU case (needs CUDA)
    python scripts/bench_speculative.py --tiny --device cpu --tokens 16 --prompts 2   # smoke run
    python scripts/bench_speculative.py --compile       # on the compiled static-cache path (probe --compile)
    python scripts/bench_speculative.py --case wide --damp 0.02 --forms draft:DRAFT:4   # speculation pays

The GPU case: a random Qwen3 (hidden 1024, 8 layers, 16 heads / 8 KV heads, bf16) and its own
2-layer draft (its first two layers, embeddings and head: default_draft.py), both built in code.
Each of the first N built-in prompts is decoded plainly and with each speculative form, under
default kernels and under the mode (one probe with --confirm). A short warm-up probe runs
first so Triton compilation and CUDA start-up are not timed. Prints one row per form and
mode: prompts whose tokens differ from plain greedy, first divergences, acceptance, tokens/s
with and without speculation, and the speedup; then, per form, the speedup under the mode as
a fraction of the speedup under default kernels (target: >= 0.8), and the same at equal acceptance:
speedup = tokens per round / round cost (a round's time in plain greedy steps), and the two modes'
greedy streams differ, so their acceptance does too; the round costs' ratio compares the kernels alone.

On random weights a draft rarely agrees with its target (acceptance 2-15%), so speculation does not
pay and the ratio says little. `--damp F` builds a case where it pays: the target's decoder layers
past the draft's have their output projections (o_proj, down_proj) scaled by F, so they add little
to the residual stream and the draft (the target's first layers, embeddings and head) predicts the
target's greedy token most of the time, as a trained draft does. `--case wide` is a random Qwen3 with
the 8B widths (hidden 4096, intermediate 12288, 32 / 8 heads) and 16 layers, so the 2-layer draft
costs about an eighth of the target per token.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from nondet.probes.core.corpus import DEMO_PROMPTS
from nondet.probes.speculative.default_draft import build_draft, default_draft_dir
from nondet.probes.models.default_model import DefaultModelSpec, cache_root, default_model_dir
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

GPU_CASE = DefaultModelSpec(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128)
WIDE_CASE = DefaultModelSpec(hidden_size=4096, intermediate_size=12288, num_hidden_layers=16,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128)
CASES = {"gpu": GPU_CASE, "wide": WIDE_CASE, "tiny": DefaultModelSpec()}


def main() -> None:
    args = _parse()
    spec = CASES["tiny" if args.tiny else args.case]
    if args.damp:
        target = damped_target_dir(spec, args.draft_layers, args.damp)
        draft = target.with_name(target.name + "-draft")
        if not (draft / "nondet-draft.json").exists():
            build_draft(target, args.draft_layers, draft)
    else:
        target, draft = default_model_dir(spec), default_draft_dir(spec, layers=args.draft_layers)
    forms = tuple(f.replace("DRAFT", str(draft)) for f in args.forms.split(","))
    model = ModelSpec(name=str(target), device=args.device)
    backend = "inductor" if args.compile else None
    if not args.compile:  # the compiled path warms each condition up itself (a whole call, timed apart)
        _probe(model, forms, DEMO_PROMPTS[:1], 16, None)  # warm-up: Triton compile and allocation, untimed
    started = time.perf_counter()
    kernels = ("batch-invariant", "default") if args.mode_first else ("default", "batch-invariant")
    summary, run_dir = _probe(model, forms, DEMO_PROMPTS[:args.prompts], args.tokens, backend, kernels)
    path = "compiled static-cache generate" if args.compile else "eager"
    damped = f" (layers past {args.draft_layers} damped x{args.damp})" if args.damp else ""
    print(f"setup: {args.prompts} prompts x {args.tokens} tokens, target {_describe(spec)}{damped}, "
          f"draft = its first {args.draft_layers} layers, device {args.device}, {path}; "
          f"{time.perf_counter() - started:.0f} s")
    drafts = json.loads((run_dir / "fingerprint.json").read_text())["speculative"]
    for form, how in drafts.get("draft_decode", {}).items():
        print(f"draft of {form.replace(str(draft), 'DRAFT')}: {how}")
    for mode, entry in summary.get("decode_path", {}).get("modes", {}).items():
        print(f"decode path {mode}: {entry['path']}, warm-up {entry['warmup_s']:.1f} s, "
              f"measured {entry['measured_s']:.1f} s" + (f" ({entry['reason']})" if entry.get("reason") else ""))
    _print_table(summary["speculative"]["by_form"], str(draft))


def damped_target_dir(spec: DefaultModelSpec, keep: int, factor: float) -> Path:
    """The default model of `spec` with the output projections of its layers >= keep scaled by factor
    (built once beside the default model; its tokenizer copied)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = default_model_dir(spec)
    out = cache_root() / f"damped-{spec.digest()}-l{keep}-x{factor}"
    if (out / "nondet-damped.json").exists():
        return out
    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    with torch.no_grad():
        for layer in model.model.layers[keep:]:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    (out / "nondet-damped.json").write_text(json.dumps({"from": str(source), "keep": keep, "factor": factor}))
    return out


def _probe(model: ModelSpec, forms, prompts, tokens, backend: str | None,
           kernels=("default", "batch-invariant")) -> tuple[dict, Path]:
    out = Path(tempfile.mkdtemp(prefix="nondet-bench-spec-")) / "run"
    config = ProbeConfig(prompts=tuple(prompts), model=model, batch_sizes=(1,), max_new_tokens=tokens,
                         kernels=kernels, speculative=forms, out=str(out),
                         compile_backend=backend)
    result = run_probe(config)
    return result.summary, result.run_dir


def _print_table(rows: list[dict], draft: str) -> None:
    print("| form | kernels | prompts diverged | bits differ | first token / numeric divergence | "
          "acceptance | tok/s speculative | tok/s plain | speedup | tokens per round | round cost (plain steps) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        form = r["speculative"].replace(draft, "DRAFT")
        print(f"| {form} | {r['kernels']} | {r['prompts_diverged']} of {r['n_prompts']} | "
              f"{r['prompts_bits_differ']} | {r['first_token_divergence']} / {r['first_numeric_divergence']} | "
              f"{r['acceptance_rate']} | {r['tokens_per_s']} | {r['reference_tokens_per_s']} | {r['speedup']} | "
              f"{r['tokens_per_round']} | {r['round_cost']} |")
    for form in dict.fromkeys(r["speculative"] for r in rows):
        by = {r["kernels"]: r for r in rows if r["speculative"] == form}
        default, mode = by.get("default"), by.get("batch-invariant")
        if default and mode and default["speedup"] and mode["speedup"]:
            print(f"{form.replace(draft, 'DRAFT')}: speedup under the mode / speedup with default kernels = "
                  f"{mode['speedup'] / default['speedup']:.2f} (target >= 0.8)")
        if default and mode and default["round_cost"] and mode["round_cost"]:
            # the two modes decode different token streams, so their acceptance differs by stream;
            # at the default's tokens per round the ratio is the ratio of the round costs
            print(f"{form.replace(draft, 'DRAFT')}: the same at the default's acceptance (round cost default / "
                  f"mode) = {default['round_cost'] / mode['round_cost']:.2f}")


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
    p.add_argument("--case", choices=sorted(CASES), default="gpu", help="the target's shape (see the top of this file)")
    p.add_argument("--mode-first", action="store_true",
                   help="decode under the mode before default kernels (the host time of a compiled step grew with "
                        "the graphs compiled before it in one process: the second kernels mode paid for the first)")
    p.add_argument("--damp", type=float, default=0.0,
                   help="scale the output projections of the layers past the draft's by this (0: off)")
    return p.parse_args()


if __name__ == "__main__":
    main()
