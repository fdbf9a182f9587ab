#!/usr/bin/env bash
# Issue 15 item 4 on one device: a tuned and an untuned run give the same bits under the mode.
# A random model with the score set's linear shapes (Qwen3, hidden 4096, intermediate 14336, 32 / 8
# heads, head dim 128, 2 layers, bf16: q/o_proj K=N=4096, gate/up 4096->14336, down 14336->4096), so
# the probe's matmuls hit the tuned (K, N) cells; batch sizes 1/16/64 put its prefill and decode M in
# the retuned buckets. Steps: probe untuned (no table), `nondet kernels tune`, probe tuned, then
# scripts/compare_runs.py and each run's fingerprint kernel_tuning. Under 9 minutes on an H100/H200.
# Usage (device machine, repo root): OUT=dir bash scripts/gpu_tuned.sh
source "$(dirname "$0")/gpu_env.sh"
MODEL=$(python3 -c "from nondet.probes.default_model import DefaultModelSpec as S, default_model_dir as d
print(d(S(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8, head_dim=128)))" 2>/dev/null | tail -1)
PROBE=(python3 -m nondet probe --model "$MODEL" --device cuda --kernels batch-invariant --batch-sizes 1,16,64 -n 64)
step untuned; NONDET_KERNEL_TUNING=/tmp/no-table.json timeout 150 "${PROBE[@]}" --out /tmp/run-untuned 2>&1 | grep -v Writing | tail -3 | tee "$OUT/untuned.log"
step tune; NONDET_KERNEL_TUNING=/tmp/table.json timeout 200 python3 -m nondet kernels tune --out /tmp/table.json 2>&1 | tail -20 | tee "$OUT/tune.log"
cp /tmp/table.json "$OUT/kernel_tuning.json" 2>/dev/null
step tuned; NONDET_KERNEL_TUNING=/tmp/table.json timeout 150 "${PROBE[@]}" --out /tmp/run-tuned 2>&1 | grep -v Writing | tail -3 | tee "$OUT/tuned.log"
step compare; python3 scripts/compare_runs.py /tmp/run-untuned /tmp/run-tuned 2>&1 | tail -12 | tee "$OUT/compare.log"
for r in untuned tuned; do python3 -c "import json; print('$r', json.load(open('/tmp/run-$r/fingerprint.json')).get('kernel_tuning'))" 2>&1 | cut -c1-300; done | tee -a "$OUT/compare.log"
step done
