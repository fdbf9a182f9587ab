#!/usr/bin/env bash
# One device call for the batch-invariant kernels: versions, GPU tests, a config sweep and/or the
# benchmark. Usage (on the device machine, repo root): bash scripts/device_kernels.sh STEP...
# STEP: test | kerneltest | e2etest | sweep | quickbench | benchsplit | bench
# Results land under $OUT (or ./device-out). Timeouts: KERNEL_TIMEOUT, E2E_TIMEOUT,
# SECTION_TIMEOUT, BENCH_TIMEOUT (s). NONDET_GPU_SKIP_CONTROL=1 skips the no-mode Qwen3 control.
# The session that built this ran: kerneltest sweep e2etest; bench sweep; then
# kerneltest benchsplit e2etest (docs/benchmarks.md comes from that last call).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NONDET_GPU_RESULTS="$OUT/gpu_results.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case "$step" in
    test) timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu -rA --durations=0 2>&1 | tee "$OUT/pytest.log" | tail -40 ;;
    e2etest) timeout ${E2E_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider tests/gpu -k qwen3 -rA --durations=0 2>&1 | tee "$OUT/pytest_e2e.log" | tail -30 ;;
    kerneltest) timeout ${KERNEL_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not qwen3" -rA 2>&1 | tee "$OUT/pytest_kernels.log" | tail -30 ;;
    sweep) timeout 200 python3 -c "from nondet.kernels.bench import sweep_matmul, sweep_attention; sweep_attention(); sweep_matmul()" 2>&1 | tee "$OUT/sweep.log" ;;
    quickbench) timeout 200 python3 -m nondet kernels bench --quick --only matmul --only rmsnorm --only decode --out "$OUT/benchmarks_quick.md" 2>&1 | tail -60 ;;
    benchsplit)  # one process per section: a crash loses only its own section
      for sec in matmul rmsnorm decode e2e; do
        timeout ${SECTION_TIMEOUT:-150} python3 -m nondet kernels bench --only $sec --out "$OUT/bench_$sec.md" 2>&1 | grep -v "^|" | tail -5
        grep "^|" "$OUT/bench_$sec.md" 2>/dev/null | grep -v -- "---" | awk -F'|' '{printf "%-44s %10s %10s %6s %s\n", $2, $3, $4, $5, $6}'
      done ;;
    bench) CUDA_LAUNCH_BLOCKING=${BLOCKING:-0} timeout ${BENCH_TIMEOUT:-330} python3 -m nondet kernels bench --out "$OUT/benchmarks.md" 2>&1 | tail -100 ;;
  esac
done
[ -f "$NONDET_GPU_RESULTS" ] && cat "$NONDET_GPU_RESULTS"
echo "=== done $(date -u +%H:%M:%S)"
