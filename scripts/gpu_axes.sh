#!/usr/bin/env bash
# One device call: does the mode hold on the speculative and RL axes on a GPU (demo model)?
# Kernel-level row check, the module diagnostic, then the probe's rl and speculative sources.
# Usage (device machine, repo root): OUT=dir bash scripts/gpu_axes.sh ; one log per step in $OUT.
# Under 9 minutes on an H100 (each step has its own timeout).
source "$(dirname "$0")/gpu_env.sh"
step tests; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "masked or prefill_equals_decode" 2>&1 | tail -8 | tee "$OUT/gpu_tests.log"
step rows; timeout 60 python3 scripts/gpu_attn_rows.py 2>&1 | tail -12 | tee "$OUT/rows.log"
step diag; DIAG_TOKENS=120 timeout 80 python3 scripts/gpu_axis_diag.py 2>&1 | tail -12 | tee "$OUT/diag.log"
step rl; timeout 70 python3 -m nondet rl --device cuda --confirm -n 32 --out /tmp/run-rl 2>&1 | grep -v Writing | tail -30 | tee "$OUT/rl.log"
step rl-packed; timeout 50 python3 -m nondet rl --device cuda --confirm -n 32 --padding packed --out /tmp/run-rl-packed 2>&1 | grep -v Writing | tail -30 | tee "$OUT/rl_packed.log"
step speculative; timeout 150 python3 -m nondet probe --device cuda --speculative ngram:4,self:4 --confirm -n 96 --out /tmp/run-spec 2>&1 | grep -v Writing | tail -30 | tee "$OUT/speculative.log"
step done
