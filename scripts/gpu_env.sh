# Sourced by the device scripts (gpu_final.sh, gpu_axes.sh): $OUT, environment, device and
# versions logged to $OUT/device.log, and `step NAME` printing a timestamped header.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 COLUMNS=160 NONDET_CACHE=/tmp/nondet-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.log"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.log"
step() { echo "=== $1 $(date -u +%H:%M:%S)"; }
