#!/usr/bin/env bash
# GPU acceptance: nondet probe under tensor parallelism on 2 GPUs (NCCL).
#
# Model: a random Qwen3 (hidden 1024, 8 layers, 16 heads / 8 KV heads, head_dim 64, bf16, seed 0)
# with the embedded default's tokenizer, built here (nothing downloaded).
# Steps (each its own timeout; a failed step is reported and the next one still runs):
#   build       the model (skipped when $MODEL exists)
#   default     nondet probe --tp 2, default kernels, batch sizes $SIZES: distinct completions at TP2
#   mode        nondet probe --tp 2 --kernels batch-invariant, same sizes: must be 1 completion,
#               the same bits at every batch size
#   versus      nondet probe --tp 1,2 --confirm at batch sizes 1,8: TP1-vs-TP2 first divergence with
#               default kernels and under the mode (TP-invariance: measured, not claimed by the mode)
#   invariant   the same under the mode with --tp-invariant (the row-parallel K
#               tree that TP1 and TP2 share): TP1 vs TP2 must be bitwise equal
#   bench       a TP2 decode step (batch 1, 8, 64; KV cache after a 32-token prompt), default
#               kernels vs the mode vs the mode with the TP-invariant tree (CUDA-synchronised wall
#               time, median of 30 steps)
#   bisect      where the default run's first divergent condition leaves the prompt alone at TP2
#               (nondet.probes.tp.bisect on 2 ranks; ablation per op class, "collective" included)
# Then a Markdown table (stdout and $OUT/tp_acceptance.md); everything else under $OUT.
#
# Usage (2 GPUs, repository root):  OUT=/some/dir bash scripts/device/gpu_tp.sh     (< 8 minutes on 2 H200s)
# Knobs: SIZES (default 1-32), TOKENS (new tokens per run, default 32), BUDGET (seconds for all steps,
# default 560; a step cut short by its timeout still gets a row, from the streams it wrote). A CPU dry run of the script
# itself (gloo, a small model): DEVICE=cpu HIDDEN=128 LAYERS=2 SIZES=1,2 TOKENS=4 BENCH_BATCHES=1,2 bash scripts/device/gpu_tp.sh
set -uo pipefail
set -x
OUT=${OUT:-/tmp/nondet-gpu-tp}
mkdir -p "$OUT"
export OUT DEVICE HIDDEN LAYERS TOKENS PYTHONPATH=. PYTHONUNBUFFERED=1 COLUMNS=160 NONDET_CACHE=${NONDET_CACHE:-/tmp/nondet-cache}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off: plain ring/tree all-reduces
SIZES=${SIZES:-1-32}
TOKENS=${TOKENS:-32}
DEVICE=${DEVICE:-cuda}
HIDDEN=${HIDDEN:-1024}
LAYERS=${LAYERS:-8}
export BENCH_BATCHES=${BENCH_BATCHES:-1,8,64}
MODEL=${MODEL:-/tmp/nondet-tp-qwen3-${HIDDEN}x${LAYERS}}
PROMPT="Tell me about Richard Feynman"
FAILED=()
START=$(date +%s)
say() { set +x; echo "=== [$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/progress.log"; set -x; }
BUDGET=${BUDGET:-560}  # seconds for all steps: inside one 10-minute device call (387 s on 2 H200s)
step() {  # step NAME CAP RESERVE COMMAND...: run with timeout min(CAP, what is left minus RESERVE for the
          # steps after it), log to $OUT/NAME.log, record a failure and go on
  local name=$1 cap=$2 reserve=$3; shift 3
  local left=$(( BUDGET - ($(date +%s) - START) - reserve ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 10 ]; then FAILED+=("$name (no time left)"); say "$name: SKIPPED (no time left)"; return; fi
  say "$name: start (timeout ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  if [ $rc -ne 0 ]; then FAILED+=("$name (exit $rc)"); say "$name: FAILED (exit $rc)"; else say "$name: ok"; fi
}
rm -rf "$OUT/run-default" "$OUT/run-mode" "$OUT/run-versus" "$OUT/run-invariant" "$OUT/bench.json"  # a rerun must not append to old runs

say "device"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())), 'triton', triton.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$OUT/device.log"

step build 45 360 python3 - "$MODEL" "$HIDDEN" "$LAYERS" <<'PY'
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nondet.probes.models.default_model import build_tokenizer

path, hidden, layers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if not (path / "config.json").exists():
    tok = build_tokenizer(2048)
    tok.save_pretrained(path)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
print("model:", path)
PY

COMMON=(--model "$MODEL" --device "$DEVICE" --prompt "$PROMPT" --max-new-tokens "$TOKENS" --positions ends)
step default 130 220 python3 -m nondet probe --tp 2 --batch-sizes "$SIZES" "${COMMON[@]}" --out "$OUT/run-default"
step mode 130 130 python3 -m nondet probe --tp 2 --kernels batch-invariant --batch-sizes "$SIZES" "${COMMON[@]}" \
  --out "$OUT/run-mode"
step versus 70 140 python3 -m nondet probe --tp 1,2 --confirm --batch-sizes 1,8 "${COMMON[@]}" --out "$OUT/run-versus"
step invariant 60 80 python3 -m nondet probe --tp 1,2 --tp-invariant --kernels batch-invariant --batch-sizes 1,8 \
  "${COMMON[@]}" --out "$OUT/run-invariant"

cat > "$OUT/tp_decode_bench.py" <<'PY'
"""One TP2 decode step, default kernels vs nondet's batch-invariant mode: 2 spawned ranks, NCCL."""
import contextlib
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BATCHES = tuple(int(b) for b in os.environ.get("BENCH_BATCHES", "1,8,64").split(","))
PROMPT, WARM, ITERS = 32, 5, 30
CUDA = os.environ.get("DEVICE", "cuda") == "cuda"


def sync():
    if CUDA:
        torch.cuda.synchronize()


def rank_main(rank, world, port, model_dir, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if CUDA:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if CUDA else "gloo", rank=rank, world_size=world)
    from transformers import AutoModelForCausalLM

    from nondet.probes.tp.load import tp_kwargs  # DistributedConfig where transformers has it

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, **tp_kwargs(world)).eval()
    rows = []
    for batch in BATCHES:
        ids = torch.randint(5, 1000, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))
        ids = ids.cuda() if CUDA else ids
        for mode in ("default", "batch-invariant", "tp-invariant"):
            with scope(mode, model, world), torch.inference_mode():
                rows.append({"batch": batch, "kernels": mode, "ms": decode_ms(model, ids)})
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "prompt_tokens": PROMPT, "steps": ITERS, "rows": rows}, f, indent=1)
        print(json.dumps(rows))
    dist.destroy_process_group()


def scope(mode, model, world):
    """default kernels, the mode, or the mode with the TP-invariant K tree (as --tp-invariant at max degree world)."""
    from nondet.kernels import batch_invariant, collective, tp_tree

    stack = contextlib.ExitStack()
    if mode != "default":
        stack.enter_context(batch_invariant(model=model))
    if mode == "tp-invariant":
        stack.enter_context(tp_tree.tree_linears(model, 1))  # max degree / degree leaves per rank
        stack.enter_context(collective.tree_order())
    return stack


def decode_ms(model, ids):
    out = model(input_ids=ids, use_cache=True)
    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(WARM + ITERS):
        sync()
        started = time.perf_counter()
        out = model(input_ids=tok, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        sync()
        times.append(1000 * (time.perf_counter() - started))
    return round(statistics.median(times[WARM:]), 3)


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, sys.argv[1], sys.argv[2]), nprocs=2, join=True)
PY
step bench 70 30 python3 "$OUT/tp_decode_bench.py" "$MODEL" "$OUT/bench.json"
step bisect 60 0 python3 -c "
import json
from nondet.probes.bisect.bisect import BisectConfig
from nondet.probes.tp.bisect import run_tp_bisect
b = run_tp_bisect(BisectConfig(run_dir='$OUT/run-default'), on_stage=print).bisect
print(json.dumps({k: b.get(k) for k in ('tp_degree', 'condition_id', 'origin', 'flip_step', 'minimal_set')}))"

say "table"
python3 - <<'PY' 2>&1 | tee "$OUT/tp_acceptance.md"
import json, os
from pathlib import Path

OUT = Path(os.environ["OUT"])


def summary(name):
    """summary.json, or (a step cut short) the same figures from the streams written so far."""
    run = OUT / name
    if (run / "summary.json").exists():
        return json.loads((run / "summary.json").read_text()), ""
    if not (run / "streams.jsonl").exists():
        return None, "not run"
    from nondet.probes.core.summarize import summarize_modes
    from nondet.probes.tp.summary import tp_section

    streams = [json.loads(l) for l in (run / "streams.jsonl").read_text().splitlines() if l.strip()]
    degrees = tuple(sorted({s["tp"] for s in streams}))
    if not any(s["is_reference"] for s in streams):
        return None, "no reference written"
    doc = summarize_modes(streams)
    doc["tensor_parallel"] = tp_section(streams, degrees)
    return doc, " (partial: cut short, from the streams written)"


def cell(v):
    return "—" if v is None else str(v)


fp = {}
for name in ("run-default", "run-mode", "run-versus", "run-invariant"):
    if (OUT / name / "fingerprint.json").exists():
        fp = json.loads((OUT / name / "fingerprint.json").read_text())
        break
tp = fp.get("tensor_parallel", {})
print(f"# nondet under tensor parallelism ({fp.get('device', '?')} x2)\n")
print(f"torch {fp.get('torch')}, transformers {fp.get('transformers')}, triton {fp.get('triton')}, "
      f"NCCL {tp.get('nccl_version')}, NCCL_ALGO={tp.get('nccl_algo')}, NCCL_PROTO={tp.get('nccl_proto')}, "
      f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}; model: random Qwen3 hidden {os.environ['HIDDEN']} x "
      f"{os.environ['LAYERS']} layers bf16, {os.environ['TOKENS']} new tokens; "
      f"prompt alone at batch 1 at the smallest degree is the reference\n")
print("| run | kernels | TP | runs | distinct completions | first token divergence | first numeric divergence |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
versus = []
for name in ("run-default", "run-mode", "run-versus", "run-invariant"):
    doc, note = summary(name)
    if doc is None:
        print(f"| {name} | — | — | — | — | — | {note} |")
        continue
    for mode, m in doc.get("tensor_parallel", {}).get("modes", {}).items():
        for r in m["by_degree"]:
            print(f"| {name}{note} | {mode} | TP{r['tp']} | {r['n_runs']} | {r['distinct_completions']} | "
                  f"{cell(r['first_token_divergence'])} | {cell(r['first_numeric_divergence'])} |")
        versus += [(name, mode, r) for r in m["vs_reference"]]
print("\n| run | kernels | TP vs | bitwise equal | first token divergence | first numeric divergence |")
print("| --- | --- | --- | --- | ---: | ---: |")
for name, mode, r in versus:
    print(f"| {name} | {mode} | TP{r['tp']} vs TP{r['against']} | {'yes' if r['bitwise_equal'] else 'no'} | "
          f"{cell(r['first_token_divergence'])} | {cell(r['first_numeric_divergence'])} |")
for name in ("run-mode",):
    if (OUT / name / "fingerprint.json").exists():
        for g in json.loads((OUT / name / "fingerprint.json").read_text())["tensor_parallel"]["groups"]:
            print(f"\n{name}: TP{g['degree']} invariant all-reduce calls: {g.get('invariant_all_reduce_calls')} "
                  f"(collective: {tp.get('collective', {}).get('batch-invariant')})")
bench = OUT / "bench.json"
if bench.exists():
    rows = json.loads(bench.read_text())["rows"]
    ms = {(r["batch"], r["kernels"]): r["ms"] for r in rows}
    print("\n| TP2 decode step | default ms | batch-invariant ms | cost | TP-invariant ms | cost |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for b in sorted({r["batch"] for r in rows}):
        d, m, t = (ms.get((b, k)) for k in ("default", "batch-invariant", "tp-invariant"))
        cost = lambda x: f"{x / d:.2f}x" if d and x else "—"
        print(f"| batch {b} | {d} | {m} | {cost(m)} | {t} | {cost(t)} |")
else:
    print("\nbench: not run")
bisect = OUT / "run-default" / "bisect.json"
if bisect.exists():
    b = json.loads(bisect.read_text())
    o = b.get("origin") or {}
    print(f"\nTP{b.get('tp_degree')} bisect of {b['condition_id']} row {b['position']}: first differing point "
          f"{o.get('module')} ({o.get('op_class')}) at step {o.get('step')}; token flip at step {b.get('flip_step')}; "
          f"minimal invariant set {b.get('minimal_set')}")
else:
    print("\nbisect: not run (or no divergence to bisect)")
PY

say "done; failed steps: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]
