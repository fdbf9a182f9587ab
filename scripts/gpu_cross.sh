#!/usr/bin/env bash
# Issue 15 item 4: two machines of one GPU architecture (an H100 and an H200) give the same bits under
# the mode. Two device calls, one per kind:
#   1st (e.g. nvidia-h100-x1):  OUT=$OUT bash scripts/gpu_cross.sh record
#        -> $OUT/cross_streams.jsonl; here: mkdir -p .cross && cp <files_at>/cross_streams.jsonl .cross/
#           (and echo /.cross/ >> .git/info/exclude)
#   2nd (e.g. nvidia-h200, carry [".cross"]):  OUT=$OUT bash scripts/gpu_cross.sh compare
#        -> the same probe, then scripts/compare_runs.py against the first machine's streams.
# The probe: the embedded demo model, 8 prompts, batch sizes 1/2/8, 200 tokens, --kernels batch-invariant.
source "$(dirname "$0")/gpu_env.sh"
step probe; timeout 300 python3 -m nondet probe --device cuda --kernels batch-invariant --batch-sizes 1,2,8 \
  --out /tmp/run-cross 2>&1 | grep -v Writing | tail -4 | tee "$OUT/cross_probe.log"
cp /tmp/run-cross/streams.jsonl "$OUT/cross_streams.jsonl"
if [ "${1:-record}" = compare ]; then
  step compare; mkdir -p /tmp/run-other && cp .cross/cross_streams.jsonl /tmp/run-other/streams.jsonl
  python3 scripts/compare_runs.py /tmp/run-other /tmp/run-cross 2>&1 | tail -20 | tee "$OUT/cross_compare.log"
fi
step done
