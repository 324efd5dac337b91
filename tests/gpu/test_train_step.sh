#!/usr/bin/env bash
# GpuCheck.train_step: the training step of scripts/gpu-check.sh run on the CUDA simulator
# (--train-device cuda-sim, `tiny` at sequence 64, 4 steps of 2 micro-batches) where the planner's
# choice matters: with a device memory between the planner's totals for 1 and 2 layers it must
# train 1 layer and say why; and after an out-of-memory failure of the planner's choice it retries
# once with 3/4 of the layers. (Room for the whole model: the script's rehearsal, test_rehearsal.sh.)
#   test_train_step.sh GPU_CHECK_SH BUILD_DIR (holding llamatrain)
set -euo pipefail
script=$1
bin_dir=$2
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
lt=$bin_dir/llamatrain
args=(--steps train --bin-dir "$bin_dir" --train-device cuda-sim --train-model tiny --train-seq-len 64 --train-steps 4
  --train-micro-batches 2)

# check_table LOG TABLE LAYERS: the table's rows, the layer count chosen, and the step passed.
check_table() {
  check_train_table "$2" "$3" 2
  [ "$(summary_row "$(dirname "$2")/summary.md" "step train")" = PASS ] || fail "the summary does not say the step passed"
}

# The planner's totals for 1 and 2 layers; a device between them holds 1 layer.
echo "localhost slots=1   # gpu=H100-SXM5-80GB" >"$tmp/h100.hosts"  # a file: inputs must be regular files
total() {
  "$lt" plan --hostfile "$tmp/h100.hosts" --model-config tiny --n-layers "$1" \
    --seq-len 64 --global-batch 1 --batch-size 1 --tokens 4096 --zero 1 --json |
    python3 -c 'import json, sys; d = json.load(sys.stdin); print(int(d["ranks"][0]["memory"]["total_bytes"]))'
}
t1=$(total 1)
t2=$(total 2)
((t1 < t2)) || fail "planner totals: 1 layer $t1, 2 layers $t2"
# The planner's usable fraction is 0.9; the step keeps 2 GiB free besides (its margin).
memory=$((((t1 + t2) / 2 + 2 * 1024 * 1024 * 1024) * 10 / 9))
OUT=$tmp/part bash "$script" "${args[@]}" --train-memory-bytes "$memory" >"$tmp/part.log" 2>&1 ||
  { cat "$tmp/part.log"; fail "gpu-check.sh (room for 1 layer)"; }
grep -E "planner|layers:" "$tmp/part.log"
check_table "$tmp/part.log" "$tmp/part/gpu-check/train-table.md" 1
grep -q "the full model does not fit by the planner" "$tmp/part.log" || fail "the 1-layer case does not say why"

# Out of device memory with the planner's choice: one retry with 3/4 of the layers. A stand-in
# llamatrain fails `train --n-layers 2` the way the CUDA backend does and runs the rest.
mkdir "$tmp/fake"
cat >"$tmp/fake/llamatrain" <<FAKE
#!/usr/bin/env bash
if [ "\$1" = train ] && [[ " \$* " == *" --n-layers 2 "* ]]; then
  echo "llamatrain train: error: cannot allocate 123 bytes of GPU memory: out of memory" >&2
  exit 1
fi
exec "$lt" "\$@"
FAKE
chmod +x "$tmp/fake/llamatrain"
args[3]=$tmp/fake  # --bin-dir
OUT=$tmp/oom bash "$script" "${args[@]}" >"$tmp/oom.log" 2>&1 || { cat "$tmp/oom.log"; fail "gpu-check.sh (out of memory, retried)"; }
grep -E "out of device memory|FAILED" "$tmp/oom.log"
check_table "$tmp/oom.log" "$tmp/oom/gpu-check/train-table.md" 1
grep -q "retried with 3/4 of them" "$tmp/oom/gpu-check/train-table.md" || fail "the retry is not said in the table"
echo "PASS: training step tables with 1 layer, by the planner and after an out-of-memory retry"
