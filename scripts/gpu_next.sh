#!/usr/bin/env bash
# The first device call of the next session (one call, < 9 minutes on an H100): what this session
# could not finish. Then, in a call of its own: OUT=$OUT bash scripts/gpu_cases.sh speculative (540 s).
#   graph     scripts/gpu_graph_decode.py: does a CUDA-graphed static-cache decode keep the mode's bits,
#             and how fast is it (issue 17 item 3)
#   profile   per-batch decode step time default vs mode, and the batch-1 host profile
#   probe     bench_probe --gpu again (issue 17's GPU case)
#   rl        bench_rl (the trainer's cost under the mode; noisy: 15 ms between calls last time)
source "$(dirname "$0")/gpu_env.sh"
step graph; timeout 120 python3 scripts/gpu_graph_decode.py 2>&1 | grep -v Writing | tail -24 | tee "$OUT/graph.log"
step profile; timeout 150 python3 scripts/gpu_profile_decode.py 2>&1 | tail -36 | tee "$OUT/profile.log"
step probe; timeout 200 python3 scripts/bench_probe.py --gpu 2>&1 | tail -8 | tee "$OUT/bench_probe.log"
step rl; timeout 80 python3 scripts/bench_rl.py 2>&1 | tail -8 | tee "$OUT/bench_rl.log"
step done
