#!/usr/bin/env bash
# One device call: the GPU acceptance cases of issues 14 and 13 (random Qwen3 hidden 1024 x 8 layers bf16).
#   rl           nondet rl, 32 prompts x 256 sampled tokens at temperature 1, sampler batch 32, trainer
#                micro-batch 1/4/8 right-padded, default kernels then the mode (--confirm)
#   speculative  scripts/bench_speculative.py: 8 prompts x 200 tokens, draft (its 2-layer draft), self, ngram
# Usage (device machine, repo root): OUT=dir bash scripts/gpu_cases.sh [rl] [speculative] ; one log per
# step in $OUT (default: both). rl takes ~60 s on an H100; speculative's full case took over 390 s (the
# draft form runs at ~18 tok/s), so give it a call of its own: its timeout is 540 s.
source "$(dirname "$0")/gpu_env.sh"
MODEL=$(python3 -c "import sys; sys.path.insert(0, 'scripts')
from bench_probe import GPU_CASE
from nondet.probes.default_model import default_model_dir
print(default_model_dir(GPU_CASE))" 2>/dev/null | tail -1)
python3 -c "import json
from nondet.probes.corpus import DEMO_PROMPTS
tails = ('', ' and why it matters', ', in a few words', ': a short story')
for p in DEMO_PROMPTS:
    for t in tails:
        print(json.dumps({'prompt': p + t}))" > /tmp/prompts32.jsonl
STEPS=" ${*:-rl speculative} "
if [[ $STEPS == *" rl "* ]]; then
step rl; timeout 170 python3 -m nondet rl "$MODEL" --device cuda --prompts /tmp/prompts32.jsonl --sampler-batch 32 --micro-batch 1,4,8 -n 256 --confirm --out /tmp/run-rl32 2>&1 | grep -v Writing | tail -24 | tee "$OUT/rl32.log"
fi
if [[ $STEPS == *" speculative "* ]]; then
step speculative; timeout 540 python3 scripts/bench_speculative.py 2>&1 | tail -12 | tee "$OUT/bench_speculative.log"
fi
step done
