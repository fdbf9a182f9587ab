#!/usr/bin/env bash
# The release checks on a GPU machine: named steps, one log per step under $OUT.
#
#   OUT=dir bash scripts/gpu.sh STEP...          (repository root; default OUT=device-out)
#
# Correctness
#   tests        pytest tests/gpu (kernel bits, invariance, tuning; the e2e Qwen3 tests included: ~9 min on an H200)
#   sanitize     the kernel tests under compute-sanitizer memcheck
#   attention    sinks, softcap, sliding window, MLA: tests/test_kernels_attention_features.py on CUDA
#   split-tests  tests/test_kernels_attention_split.py and test_kernels_counters.py on CUDA (split == fused bits,
#                50 racing repeats; the counter buffer left at zero, other streams, a captured graph)
#   compile-tests tests/gpu/test_compile_gpu.py (compiled vs eager bits: prefill, decode, a training forward)
#   draft-tests  tests/test_speculative_compiled_draft.py on CUDA (the compiled draft proposes transformers' tokens)
#   family       scripts/device/gpu_family_matrix.py: every supported model family, invariant under the mode
#   moe          scripts/device/gpu_moe.py: a Qwen3-30B-A3B-shaped MoE, default vs the mode, and its step time
#   demo         probe / speculative / rl on the demo model with --confirm
#   bisect       scripts/device/gpu_bisect.py: what bisect blames on a GPU model, with and without a baseline
#   prefill-axis scripts/device/gpu_prefill_axis.py: prefix cache and chunked prefill vs one pass, dense and MoE
#   sampling     seeded sampling on the prefill axis's dense model: one generator for the batch vs one per request
# Speed (each prints a table; docs/benchmarks.md keeps the figures)
#   score        nondet kernels bench --score (ratios to cuBLAS / SDPA, invariance checked in the same run)
#   tune         nondet kernels tune, then the score under the tuned table
#   census       scripts/bench_census.py --moe: the op census's one-time cost on the 8B-shaped Qwen3 and the MoE
#   compile      scripts/device/gpu_compile.py: an 8B-shaped Qwen3 decoded on the compiled path, default vs the mode
#   prefill      the same model's 512-token prefill: eager, compiled, and compiled under CUDA graphs
#   probe        scripts/bench_probe.py --gpu (the probe's GPU case and its roofline)
#   probe-compile scripts/bench_probe.py --gpu --compile (the same case on the compiled path)
#   precompile   scripts/bench_precompile.py on CUDA with Inductor's CUDA graphs: a saved decode step loaded in a
#                new process vs dynamo's warm JIT, bits compared
#   probe-cli    the acceptance row: `nondet probe --compile --confirm` on the GPU case (one prompt), timed
#                whole from a cold NONDET_CACHE, again warm, eager, and the 8 built-in prompts warm
#                (PROBE_CLI_RUNS picks; the runs share one new cache, so only the first is cold, and a later
#                name beginning "cold" and longer, e.g. cold-alone, starts another new cache for itself and the
#                runs after it; -nographs in a name, e.g. "cold-nographs warm-nographs", runs the compiled path
#                without CUDA graphs: NONDET_CUDA_GRAPHS=0; -alone compiles the mode's step in the probe's own
#                process, NONDET_COMPILE_AHEAD=0 (with cudagraphs: no second process compiling the mode's kernels
#                beside the probe); -noprefetch: NONDET_PREFETCH=0 (no threads for Triton's key and the GPU's
#                libraries); -nosaved: NONDET_SAVED_CENSUS=0 (the op census taken, not read); cudagraphs in a name, e.g. "cold-cudagraphs cudagraphs-warm", runs
#                `--cuda-graphs` in place of --compile, static `--kv-cache static` eager); each with the probe's stages timed and
#                torch's compile-time breakdown (scripts/device/gpu_probe_cli.py)
#   step-trace   the mode's saved decode step traced with the KV length symbolic on a one-layer GPU case (-b 2,4:
#                the batch 2+ function), NONDET_DEBUG=1: how each function was made, and a fallback's traceback
#                ($OUT/step-trace.log; about 60 s a try, where the acceptance row's cold run is 109-133 s)
#   rl           scripts/bench_rl.py (the trainer step under the mode)
#   rl-compile   scripts/bench_rl.py --compile (the same step with a torch.compile'd forward)
#   speculative  scripts/bench_speculative.py (speedup kept under the mode)
#   speculative-wide  the same on the compiled path where speculation pays (8B widths, damped target, 2-layer draft)
# One fleet, one answer (bitwise identical streams under the mode)
#   tuned        a tuned and an untuned kernel table on this device
#   cross-record the probe's streams on this device -> $OUT/cross_streams.jsonl (and cross_fingerprint.json)
#   cross-compare the same probe, compared with .cross/cross_streams.jsonl (and its fingerprint) recorded on another kind
#   tp-speed     scripts/device/gpu_tp_speed.py: the decode step at TP1 / TP2 / TP4 (as many GPUs as there are),
#                eager and compiled (TP_SPEED_ARGS, e.g. "--layers 8 --paths compiled"; compiled TP needs the
#                transformers of scripts/device/wheels.sh, carried as .device-wheels)
#   tp-check     on 4 GPUs: --tp-invariant's tree compiled keeps eager's bits (tests/gpu/test_tp_tree_gpu.py, its
#                control), and one layer's logits at TP1 / TP2 / TP4, eager and compiled, agree (tp_speed.md)
#   allreduce    on 2+ GPUs: the mode's all-reduce as the one-shot over symmetric memory (tests/gpu/test_symmetric_sum_gpu.py,
#                its control), then one all-reduce's latency by route (scripts/device/gpu_allreduce_latency.py; the route
#                line must read "one-shot" where symmetric memory is there)
#   tp-table     scripts/device/gpu_tp_table.sh: on 4 GPUs, TP1 and TP2 side by side, then TP4 (TP_TABLE_ARGS;
#                TP_TABLE_WORLDS groups, e.g. "2:default,2:batch-invariant 4": one process per degree and kernels)
# Tensor parallelism needs 2 GPUs: scripts/device/gpu_tp.sh. Kernel tuning sweeps and profiles: scripts/device/README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
# the tree first; a PYTHONPATH the caller set (e.g. a pip install --target folder) after it
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=160 NONDET_CACHE=${NONDET_CACHE:-/tmp/nondet-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.log"
# the device image sets PYTHONDONTWRITEBYTECODE=1, so every process compiled torch's and transformers' modules from
# source again: 9.7-9.9 s of imports where an installed environment (pip writes the bytecode) takes 4.9-5.6 s
# (docs/benchmarks.md, 2026-12-01 11:28); timings here are an installed environment's: bytecode written, once
unset PYTHONDONTWRITEBYTECODE
if [ -f .device-wheels/VERSION ]; then  # a newer transformers carried as wheels (scripts/device/wheels.sh)
  python3 -m pip install -q --no-index --find-links .device-wheels "transformers==$(cat .device-wheels/VERSION)" \
    > "$OUT/wheels.log" 2>&1 || echo "carried transformers not installed: see $OUT/wheels.log"
fi
python3 -c "import torch, triton, transformers, transformers.generation.utils, nondet.probes.probe
print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)" | tee -a "$OUT/device.log"

quiet() { grep -v Writing; }  # transformers' save messages
probe_demo() {  # name, extra args...
  local name=$1; shift
  timeout 200 python3 -m nondet probe --device cuda --confirm --out "/tmp/run-$name" "$@" 2>&1 | quiet | tail -30
}
tuned_model() {  # a random model with the score set's linear shapes, so the probe's matmuls hit tuned cells
  python3 -c "from nondet.probes.models.default_model import DefaultModelSpec as S, default_model_dir as d
print(d(S(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
          num_key_value_heads=8, head_dim=128)))" 2>/dev/null | tail -1
}

run_step() {
  case "$1" in
    tests) timeout 540 python3 -m pytest -q -p no:cacheprovider tests/gpu -rA 2>&1 | tee "$OUT/tests-pytest.log" | tail -40 ;;  # whole log as it goes: a call cut at its limit keeps it
    sanitize) timeout 300 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest -q -x \
                -p no:cacheprovider tests/gpu -k "not qwen3" 2>&1 | tail -30 ;;
    attention) NONDET_ATTN_FEATURES_INNER=1 NONDET_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider \
                 tests/test_kernels_attention_features.py 2>&1 | tail -30 ;;
    family) timeout 300 python3 scripts/device/gpu_family_matrix.py 2>&1 | quiet | grep -v "Loading weights" | tail -80 ;;
    census) timeout 400 python3 scripts/bench_census.py --moe 2>&1 | quiet | tail -12 ;;
    compile) timeout 560 python3 scripts/device/gpu_compile.py ${COMPILE_ARGS:-} 2>&1 | quiet | tail -40 ;;
    prefill) timeout 560 python3 scripts/device/gpu_compile.py --prefill ${COMPILE_ARGS:-} 2>&1 | quiet | tail -20 ;;
    split-tests) NONDET_ATTN_SPLIT_INNER=1 NONDET_COUNTERS_INNER=1 NONDET_TEST_DEVICE=cuda timeout 200 python3 -m pytest \
                   -q -p no:cacheprovider tests/test_kernels_attention_split.py tests/test_kernels_counters.py 2>&1 | tail -15 ;;
    moe) timeout 480 python3 scripts/device/gpu_moe.py 2>&1 | quiet | grep -v "Loading weights" | tail -150 ;;
    demo) probe_demo probe; probe_demo spec --speculative ngram:4,self:4
          timeout 120 python3 -m nondet rl --device cuda --confirm -n 32 --out /tmp/run-rl 2>&1 | quiet | tail -20 ;;
    bisect) timeout 480 python3 scripts/device/gpu_bisect.py 2>&1 | tail -30 ;;
    sampling) local model; model=$(python3 -c "import sys; sys.path.insert(0, 'scripts/device')
from gpu_prefill_axis import dense_model; print(dense_model())" 2>/dev/null | tail -1)
              for s in shared per-request; do rm -rf "/tmp/run-sampling-$s"
                timeout 240 python3 -m nondet probe --model "$model" --device cuda -p "Tell me about Richard Feynman" \
                  -b 1,2,4,8 --temperature 1 --sampler "$s" --confirm -n 64 --out "/tmp/run-sampling-$s" 2>&1 | tail -16
              done ;;
    prefill-axis) timeout 560 python3 scripts/device/gpu_prefill_axis.py --out "$OUT" 2>&1 | quiet | tail -250 ;;
    score) timeout 420 python3 -m nondet kernels bench --score --out "$OUT/score.md" 2>&1 | tail -60 ;;
    probe) timeout 300 python3 scripts/bench_probe.py --gpu 2>&1 | tail -12 ;;
    probe-compile) timeout 470 python3 scripts/bench_probe.py --gpu --compile 2>&1 | quiet | tail -12 ;;
    precompile) timeout 400 python3 scripts/bench_precompile.py --device cuda --hidden 1024 --vocab 32000 --cudagraphs \
                  2>&1 | quiet | tail -20 ;;
    probe-cli) local model; model=$(python3 -c "import sys; sys.path.insert(0, 'scripts')
from bench_probe import GPU_CASE; from nondet.probes.models.default_model import default_model_dir as d
print(d(GPU_CASE))" 2>/dev/null | tail -1)
               local cache; cache=$(mktemp -d)  # cold: nothing compiled yet for this model
               local base=(probe --model "$model" --device cuda --confirm -b 1,2,4,8,16,32,64,128 -n 200)
               for run in ${PROBE_CLI_RUNS:-cold warm eager prompts8-warm}; do
                 local args=("${base[@]}" -p "Tell me about Richard Feynman" --compile)
                 case "$run" in eager*) args=("${base[@]}" -p "Tell me about Richard Feynman") ;;
                                prompts8-warm*) args=("${base[@]}" --compile) ;;  # the 8 built-in prompts
                                cold?*) cache=$(mktemp -d) ;;  # a second cold run: a new cache, shared by later runs
                 esac
                 case "$run" in prompts8*cudagraphs*) args=("${base[@]}" --cuda-graphs) ;;  # the 8 built-in prompts
                                *cudagraphs*) args=("${base[@]}" -p "Tell me about Richard Feynman" --cuda-graphs) ;;
                                *static*) args=("${base[@]}" -p "Tell me about Richard Feynman" --kv-cache static) ;;
                 esac  # eager kernels from recorded CUDA graphs (--cuda-graphs), or eager on the same static cache
                 local graphs=1 ahead=""; case "$run" in *-nographs*) graphs=0 ;; esac  # no CUDA graphs
                 case "$run" in *-alone*) ahead=0 ;; esac  # no second process: the mode compiled / decoded here
                 local prefetch=1 saved=1  # -noprefetch: no threads for the GPU's first costs; -nosaved: census taken
                 case "$run" in *-noprefetch*) prefetch=0 ;; esac; case "$run" in *-nosaved*) saved=0 ;; esac
                 rm -rf "/tmp/run-cli-$run"; local t0; t0=$(date +%s.%N)
                 NONDET_CUDA_GRAPHS=$graphs NONDET_COMPILE_AHEAD=$ahead NONDET_PREFETCH=$prefetch NONDET_SAVED_CENSUS=$saved \
                 NONDET_CACHE=$cache TORCH_LOGS=recompiles timeout 280 \
                   python3 scripts/device/gpu_probe_cli.py "${args[@]}" --out "/tmp/run-cli-$run" \
                   > "$OUT/probe-cli-$run.log" 2>&1
                 echo "$run: exit $? wall $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s," \
                   "recompiles logged $(grep -c 'Recompiling function' "$OUT/probe-cli-$run.log")"
                 grep -A12 "^== wall" "$OUT/probe-cli-$run.log"
                 grep -A8 "^== stages" "$OUT/probe-cli-$run.log"
                 python3 -c "import json; s = json.load(open('/tmp/run-cli-$run/summary.json'))
print(json.dumps(s.get('decode_path')), s.get('decoded_ahead', '')); print({m: (v['distinct_completions'], v['first_numeric_divergence'])
for m, v in s['modes'].items()})" 2>&1 | tail -3
               done ;;
    step-trace) local one; one=$(python3 -c "import dataclasses, sys; sys.path.insert(0, 'scripts')
from bench_probe import GPU_CASE; from nondet.probes.models.default_model import default_model_dir as d
print(d(dataclasses.replace(GPU_CASE, num_hidden_layers=1)))" 2>/dev/null | tail -1)
                rm -rf /tmp/run-step-trace
                NONDET_CACHE=$(mktemp -d) NONDET_DEBUG=1 timeout 150 python3 -m nondet probe --model "$one" --device cuda \
                  --kernels batch-invariant --compile -b 2,4 -n 4 -p "Tell me about Richard Feynman" \
                  --out /tmp/run-step-trace > "$OUT/step-trace.log" 2>&1
                echo "exit $?"; grep -o "CantSplit[^\"]*\|NameError[^\"]*\|CompilationError[^\"]*" "$OUT/step-trace.log" | sort | uniq -c
                python3 -c "import json
print(json.load(open('/tmp/run-step-trace/summary.json'))['decode_path']['precompiled'])" 2>&1 | tail -1 ;;
    rl) timeout 120 python3 scripts/bench_rl.py 2>&1 | tail -12 ;;
    rl-compile) timeout 420 python3 scripts/bench_rl.py --compile 2>&1 | tail -12 ;;
    compile-tests) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_compile_gpu.py -rA 2>&1 | tail -15 ;;
    speculative) timeout 540 python3 scripts/bench_speculative.py 2>&1 | tail -14 ;;
    speculative-wide) timeout 540 python3 scripts/bench_speculative.py --case wide --damp 0.02 --forms draft:DRAFT:4 \
                        --prompts 1 --tokens 96 --compile ${SPEC_ARGS:-} 2>&1 | quiet | tail -16 ;;
    draft-tests) NONDET_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider \
                   tests/test_speculative_compiled_draft.py 2>&1 | tail -15 ;;
    tune) timeout 300 python3 -m nondet kernels tune --out "$OUT/kernel-tuning.json" 2>&1 | tail -20
          NONDET_KERNEL_TUNING="$OUT/kernel-tuning.json" timeout 420 python3 -m nondet kernels bench --score \
            --out "$OUT/score_tuned.md" 2>&1 | tail -20 ;;
    tuned) local model; model=$(tuned_model)
           local probe=(python3 -m nondet probe --model "$model" --device cuda --kernels batch-invariant
                        --batch-sizes 1,16,64 -n 64)
           NONDET_KERNEL_TUNING=/tmp/no-table.json timeout 150 "${probe[@]}" --out /tmp/run-untuned 2>&1 | tail -3
           NONDET_KERNEL_TUNING=/tmp/table.json timeout 200 python3 -m nondet kernels tune --out /tmp/table.json \
             2>&1 | tail -5
           NONDET_KERNEL_TUNING=/tmp/table.json timeout 150 "${probe[@]}" --out /tmp/run-tuned 2>&1 | tail -3
           python3 -m nondet compare /tmp/run-untuned /tmp/run-tuned 2>&1 | tail -12 ;;
    cross-record) rm -rf /tmp/run-cross  # a warm machine keeps /tmp: a second probe there would refuse the --out
                  timeout 300 python3 -m nondet probe --device cuda --kernels batch-invariant --batch-sizes 1,2,8 \
                    --out /tmp/run-cross 2>&1 | tail -4
                  cp /tmp/run-cross/streams.jsonl "$OUT/cross_streams.jsonl"
                  cp /tmp/run-cross/fingerprint.json "$OUT/cross_fingerprint.json" ;;
    cross-compare) run_step cross-record
                   [ -s /tmp/run-cross/streams.jsonl ] || { echo "cross-record made no streams: nothing to compare"; return 1; }
                   rm -rf /tmp/run-other && mkdir -p /tmp/run-other && cp .cross/cross_streams.jsonl /tmp/run-other/streams.jsonl
                   # the other kind's fingerprint, where recorded: compare then names the device (and any version) that differs
                   [ -s .cross/cross_fingerprint.json ] && cp .cross/cross_fingerprint.json /tmp/run-other/fingerprint.json
                   python3 -m nondet compare /tmp/run-other /tmp/run-cross 2>&1 | tail -20 ;;
    tp-check) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tp_tree_gpu.py 2>&1 | tail -5
              TP_TABLE_BUDGET=240 TP_TABLE_ARGS="--layers 1 --paths eager,compiled --tokens 6 --batches 1,8 \
                --kernels default,tp-invariant --tree-degree 4" timeout 260 bash scripts/device/gpu_tp_table.sh | tail -12 ;;
    allreduce) NCCL_NVLS_ENABLE=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_symmetric_sum_gpu.py \
                 -rA 2>&1 | grep -v -i warn | tail -15
               worlds=$(nvidia-smi -L | wc -l); [ "$worlds" -ge 4 ] && worlds=2,4 || worlds=2
               NCCL_NVLS_ENABLE=0 timeout 120 python3 scripts/device/gpu_allreduce_latency.py --worlds "$worlds" --out "$OUT" \
                 2>&1 | grep -v -i warn | tail -14 ;;
    tp-table) timeout $(( ${TP_TABLE_BUDGET:-560} + 20 )) bash scripts/device/gpu_tp_table.sh ;;
    tp-speed) NCCL_NVLS_ENABLE=0 timeout ${TP_SPEED_TIMEOUT:-560} python3 scripts/device/gpu_tp_speed.py --out "$OUT" ${TP_SPEED_ARGS:-} \
                2>&1 | grep -v -i "warn" | tail -30 ;;
    *) echo "unknown step $1 (see the header of scripts/gpu.sh)"; return 2 ;;
  esac
}

for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  run_step "$step" 2>&1 | tee "$OUT/$step.log"
done
echo "=== done $(date -u +%H:%M:%S)"
