#!/usr/bin/env bash
# One device call: the final tree's GPU tests and the probe's sources on a GPU (demo model).
# Usage (device machine, repo root): OUT=dir bash scripts/gpu_final.sh ; one log per step in $OUT.
source "$(dirname "$0")/gpu_env.sh"
step tests; timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py -x 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
step probe; timeout 120 python3 -m nondet probe --device cuda --confirm --out /tmp/run-probe 2>&1 | grep -v Writing | tail -40 | tee "$OUT/probe.log"
step speculative; timeout 150 python3 -m nondet probe --device cuda --speculative ngram:4,self:4 --confirm --out /tmp/run-spec 2>&1 | grep -v Writing | tail -40 | tee "$OUT/speculative.log"
step rl; timeout 90 python3 -m nondet rl --device cuda --confirm -n 32 --out /tmp/run-rl 2>&1 | grep -v Writing | tail -30 | tee "$OUT/rl.log"
step done
