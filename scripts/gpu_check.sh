#!/usr/bin/env bash
# One device call after a fix: GPU kernel tests, rl packed under the mode, the RL trainer cost,
# and the host-time profile of a decode step under the mode. One log per step in $OUT.
source "$(dirname "$0")/gpu_env.sh"
step rl-packed; timeout 60 python3 -m nondet rl --device cuda --confirm -n 32 --padding packed --out /tmp/run-rl-packed 2>&1 | grep -v Writing | tail -6 | tee "$OUT/rl_packed.log"
step bench-rl; timeout 70 python3 scripts/bench_rl.py 2>&1 | tail -8 | tee "$OUT/bench_rl.log"
step profile; timeout 90 python3 scripts/gpu_profile_decode.py 2>&1 | tail -30 | tee "$OUT/profile.log"
step tests; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not qwen3" 2>&1 | tail -8 | tee "$OUT/gpu_tests.log"
step done
