#!/usr/bin/env bash
# One device call: the timed figures of issues 13, 14, 15 and 17 on a GPU.
#   score        nondet kernels bench --score (issue 15: ratios, invariance checked in the same run)
#   probe        scripts/bench_probe.py --gpu (issue 17's GPU case, default and mode, roofline)
#   rl           scripts/bench_rl.py (issue 14: trainer step cost under the mode)
#   speculative  scripts/bench_speculative.py, 4 prompts x 128 tokens (issue 13: speedup kept under the mode)
# Usage (device machine, repo root): OUT=dir bash scripts/gpu_bench.sh ; one log per step in $OUT.
# Under 9.5 minutes on an H100 (each step has its own timeout).
source "$(dirname "$0")/gpu_env.sh"
step score; timeout 150 python3 -m nondet kernels bench --score --out "$OUT/score.md" 2>&1 | tail -4 | tee "$OUT/score.log"
step probe; timeout 170 python3 scripts/bench_probe.py --gpu 2>&1 | tail -12 | tee "$OUT/bench_probe.log"
step rl; timeout 70 python3 scripts/bench_rl.py 2>&1 | tail -12 | tee "$OUT/bench_rl.log"
step speculative; timeout 150 python3 scripts/bench_speculative.py --prompts 4 --tokens 128 2>&1 | tail -14 | tee "$OUT/bench_speculative.log"
step done
