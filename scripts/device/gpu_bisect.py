"""What nondet bisect blames on a GPU model, with and without a baseline of invariant kernels.

    OUT=dir python3 scripts/device/gpu_bisect.py        (repository root, < 8 minutes on one H100/H200)

Model: a random Qwen3 (hidden 1024, 8 layers, 16 heads / 8 KV heads, bf16, seed 0) with the random
model's tokenizer, built here (nothing downloaded). Baseline: Thinking Machines' batch_invariant_ops
covers mm, addmm, log_softmax and mean; the closest nondet set is ops={"matmul", "norm", "softmax"}
(attention stays on the model's SDPA). The probe and every bisect replay run with that baseline on;
bisect then names what still varies. A second pass with plain default kernels shows what bisect
blames without it. Prints the blamed op class per pass; writes $OUT/device_bisect.json.
"""
import json, os, time
from pathlib import Path

import torch

from nondet.kernels import batch_invariant
from nondet.probes.bisect import BisectConfig
from nondet.probes.bisect_probe import run_bisect
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

OUT = Path(os.environ.get("OUT", "device-out"))
OUT.mkdir(parents=True, exist_ok=True)
BASELINE = ("matmul", "norm", "softmax")  # ~ Thinking Machines' mm, addmm, log_softmax, mean
BATCH_SIZES = (1, 4, 16, 64, 128)
MAX_NEW_TOKENS = 160


def build_model(path: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from nondet.probes.models.default_model import build_tokenizer

    if (path / "config.json").exists():
        return
    tok = build_tokenizer(2048)
    tok.save_pretrained(path)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def one_pass(name: str, model_dir: Path, baseline: tuple) -> dict:
    started = time.perf_counter()
    run_dir = OUT / name
    probe = ProbeConfig(model=ModelSpec(str(model_dir), "bfloat16", "cuda"), batch_sizes=BATCH_SIZES,
                        placement="last", max_new_tokens=MAX_NEW_TOKENS, out=str(run_dir))
    if baseline:
        with batch_invariant(ops=set(baseline)):  # the probe sees the baseline kernels too
            result = run_probe(probe)
    else:
        result = run_probe(probe)
    mode = result.summary["modes"]["default"]
    row = {"pass": name, "baseline": list(baseline), "verdict": result.summary["verdict"],
           "distinct_completions": mode["distinct_completions"],
           "first_token_divergence": mode["first_token_divergence"],
           "first_numeric_divergence": mode["first_numeric_divergence"], "probe_seconds": round(result.seconds, 1)}
    print(f"[{name}] probe: {row['verdict']} ({row['probe_seconds']} s)", flush=True)
    if mode["first_numeric_divergence"] is None:
        row["blamed"] = None
        return row
    b = run_bisect(BisectConfig(str(run_dir), baseline=baseline),
                   lambda text: print(f"[{name}] {text}", flush=True)).bisect
    origin = b["origin"] or {}
    row.update(condition=b["condition_id"], position=b["position"], origin=b["origin"], flip_step=b["flip_step"],
               margin_at_flip=b["margin_at_flip"], reference_reproduced=b["reference_reproduced"],
               ablation=[{k: e[k] for k in ("ops", "tokens_match", "activations_match", "first_numeric_step",
                                            "first_token_divergence", "origin_removed")} for e in b["ablation"]],
               minimal_set=b["minimal_set"], blamed=origin.get("op_class"),
               seconds=round(time.perf_counter() - started, 1))
    print(f"[{name}] bisect blames op class {origin.get('op_class')}: {origin.get('module')} at step "
          f"{origin.get('step')} ({b['condition_id']} row {b['position']}); flip at {b['flip_step']}; "
          f"minimal set on top of the baseline: {b['minimal_set']}", flush=True)
    for e in b["ablation"]:
        print(f"[{name}]   ablate {'+'.join(e['ops']):32s} tokens_match={e['tokens_match']} "
              f"activations_match={e['activations_match']} origin_removed={e['origin_removed']}", flush=True)
    return row


print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
model_dir = Path(os.environ.get("NONDET_CACHE", "/tmp/nondet-cache")) / "qwen3-h1024-l8-bf16"
build_model(model_dir)
rows = [one_pass("tm-baseline", model_dir, BASELINE), one_pass("default-kernels", model_dir, ())]
(OUT / "device_bisect.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "passes": rows},
                                                   indent=1))
for r in rows:
    print(f"RESULT {r['pass']}: blamed op class = {r['blamed']}  ({r['verdict']})")
