#!/usr/bin/env bash
# One device call for the kernel work of issues 11/15. Usage (device machine, repo root):
#   bash scripts/gpu_run.sh STEP...
# STEP: race | garbage | side-stream | synced | sanitize | test | e2etest | score | tune |
#       sweep-attention | sweep-matmul | sweep-matmul2 | sweep-matmul3 | sweep-matmul4
# Logs land under $OUT (or ./device-out), one file per step.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case "$step" in
    side-stream) timeout 120 compute-sanitizer --tool memcheck --print-limit 3 python3 scripts/gpu_repro_iam.py side-stream old 2>&1 \
                   | grep -v "^=========     " | head -30 | tee "$OUT/side_stream_old.log"
                 timeout 60 python3 scripts/gpu_repro_iam.py side-stream old 2>&1 | tail -3
                 timeout 120 compute-sanitizer --tool memcheck python3 scripts/gpu_repro_iam.py side-stream 2>&1 | tail -4 | tee "$OUT/side_stream.log" ;;
    race|synced) timeout 120 python3 scripts/gpu_repro_iam.py $step 2>&1 | tail -8 | tee "$OUT/$step.log" ;;
    garbage) timeout 180 compute-sanitizer --tool memcheck --print-limit 3 python3 scripts/gpu_repro_iam.py garbage old 2>&1 \
               | grep -v "^=========     " | head -24 | tee "$OUT/garbage_old.log"
             timeout 180 compute-sanitizer --tool memcheck --print-limit 3 python3 scripts/gpu_repro_iam.py garbage 2>&1 \
               | grep -v "^=========     " | head -24 | tee "$OUT/garbage.log" ;;
    sanitize) timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x \
               -p no:cacheprovider tests/gpu -k "not qwen3 and not one_process" 2>&1 | tail -30 | tee "$OUT/sanitize.log" ;;
    sweep-attention) timeout 150 python3 scripts/gpu_sweep.py attention 2>&1 | tee "$OUT/sweep_attention.log" ;;
    sweep-matmul3) timeout 280 python3 scripts/gpu_sweep.py matmul3 2>&1 | tee "$OUT/sweep_matmul3.log" ;;
    sweep-matmul4) timeout 200 python3 scripts/gpu_sweep.py matmul4 2>&1 | tee "$OUT/sweep_matmul4.log" ;;
    e2etest) timeout ${E2E_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider tests/gpu -k qwen3 -rA --durations=0 2>&1 | tail -20 | tee "$OUT/pytest_e2e.log" ;;
    sweep-matmul2) timeout 250 python3 scripts/gpu_sweep.py matmul2 2>&1 | tee "$OUT/sweep_matmul2.log" ;;
    sweep-matmul) timeout ${SWEEP_TIMEOUT:-280} python3 scripts/gpu_sweep.py matmul 2>&1 | tee "$OUT/sweep_matmul.log" ;;
    test) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not qwen3" -rA 2>&1 | tail -30 | tee "$OUT/pytest.log" ;;
    tune) timeout 300 python3 -m nondet kernels tune --out "$OUT/kernel-tuning.json" 2>&1 | tail -20 | tee "$OUT/tune.log"
          NONDET_KERNEL_TUNING="$OUT/kernel-tuning.json" timeout ${BENCH_TIMEOUT:-420} python3 -m nondet kernels bench \
            --score --out "$OUT/benchmarks_tuned.md" 2>&1 | grep -A12 "^## matmul" | tail -10; tail -1 "$OUT/benchmarks_tuned.md" ;;
    score) timeout ${BENCH_TIMEOUT:-420} python3 -m nondet kernels bench --score --out "$OUT/benchmarks.md" 2>&1 | tail -120 | tee "$OUT/score.log" ;;
  esac
done
echo "=== done $(date -u +%H:%M:%S)"
