#!/usr/bin/env bash
# The tensor-parallel decode-step table on one 4-GPU host in one device call (scripts/device/gpu_tp_speed.py
# for each degree): TP1 on GPU 0 and TP2 on GPUs 1,2 at the same time, then TP4 on all four. Runs side by
# side never share a GPU. Each prints its own rows; then one table of every degree, and per row whether
# row 0's logits agree across degrees (--tp-invariant must), land in $OUT/tp_speed.md.
#
#   OUT=dir bash scripts/device/gpu_tp_table.sh            (gpu.sh installs the carried wheels first:
#                                                          use `bash scripts/gpu.sh tp-table`)
# Knobs: TP_TABLE_ARGS (passed to every run; default "--layers 8 --paths compiled"), TP_TABLE_BUDGET
# (seconds for everything, default 560), TP_TABLE_WORLDS (default "1,2 4": the groups of degrees run
# one after the other; the degrees of a group run side by side). A degree may name its kernels, WORLD:KERNELS
# (one name of gpu_tp_speed.py's --kernels, in place of TP_TABLE_ARGS' list): "2:default,2:batch-invariant
# 1:default,1:batch-invariant" runs one degree's kernels on separate GPUs at once, each compile beside the other.
# A run side by side times its steps while its neighbour may still compile (the same row differed by up to
# 14% between the two layouts, 2026-11-30): figures to compare come from groups of one, "2:tp-invariant 1:default".
set -uo pipefail
OUT=${OUT:-/tmp/nondet-tp-table}
mkdir -p "$OUT"
# each run's own files (its JSON, its log) in a folder of their own: a device call brings back few files
# from $OUT, so $OUT gets the merged table (tp_speed.md / .json) and one file of every run's log
PARTS=$(mktemp -d)
ARGS=${TP_TABLE_ARGS:---layers 8 --paths compiled}
BUDGET=${TP_TABLE_BUDGET:-560}
START=$(date +%s)
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: plain ring/tree all-reduces
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
slot_name() { local name=tp${1/:/-}; echo "${name//+/_}"; }  # letters, digits, '-', '_' in file names

# shellcheck disable=SC2086  # ARGS is a list of options
python3 scripts/device/gpu_tp_speed.py $ARGS --build-only --out "$PARTS" 2>&1 | tail -2
for group in ${TP_TABLE_WORLDS:-1,2 4}; do
  next_gpu=0
  for slot in ${group//,/ }; do
    world=${slot%%:*}
    kernels=(); name=$(slot_name "$slot")
    [ "$slot" != "$world" ] && kernels=(--kernels "${slot#*:}")
    gpus=$(seq -s, "$next_gpu" $(( next_gpu + world - 1 )))
    next_gpu=$(( next_gpu + world ))
    echo "=== $name on GPUs $gpus, $(date -u +%H:%M:%S), $(left) s left"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$gpus timeout "$(left)" python3 scripts/device/gpu_tp_speed.py $ARGS "${kernels[@]}" \
      --worlds "$world" --tag="-$name" --out "$PARTS" > "$PARTS/$name.log" 2>&1 &
  done
  wait
  for slot in ${group//,/ }; do
    name=$(slot_name "$slot")
    echo "--- $name"; grep -v -i warn "$PARTS/$name.log" | grep "^{\|^|\|Error" | tail -20
    { echo "=== $name"; cat "$PARTS/$name.log"; } >> "$OUT/tp-table-runs.log"
  done
done
echo "=== all degrees ($OUT/tp_speed.md)"
python3 scripts/device/gpu_tp_speed.py --merge --out "$PARTS"
cp "$PARTS"/tp_speed.md "$PARTS"/tp_speed.json "$OUT"/ 2>/dev/null
cp "$PARTS"/tp*_profile*.txt "$OUT"/ 2>/dev/null  # --profile's tables, when TP_TABLE_ARGS asks for them
echo "=== done $(date -u +%H:%M:%S)"
