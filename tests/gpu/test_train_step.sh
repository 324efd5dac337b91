#!/usr/bin/env bash
# GpuCheck.train_step: the training step of scripts/gpu-check.sh run on the CUDA simulator
# (--train-device cuda-sim, `tiny` at sequence 64, 4 steps of 2 micro-batches): the planner chooses the layers, train
# runs, and the table reports tokens/s, MFU and the peak device memory with its ratio to the
# planner's prediction. Twice: with room for the whole model, and with a device memory between
# the planner's totals for 1 and 2 layers, where it must train 1 layer and say why.
#   test_train_step.sh GPU_CHECK_SH BUILD_DIR (holding llamatrain)
set -euo pipefail
script=$1
bin_dir=$2
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
lt=$bin_dir/llamatrain
args=(--steps train --bin-dir "$bin_dir" --train-device cuda-sim --train-model tiny --train-seq-len 64 --train-steps 4
  --train-micro-batches 2)

# check_table LOG TABLE LAYERS: the table's rows and the layer count chosen.
check_table() {
  local log=$1 table=$2 layers=$3
  [ -s "$table" ] || fail "no $table"
  grep -Eq '^\| tokens/s \| [0-9]+ ' "$table" || fail "no tokens/s in $table"
  grep -q '^| run | global batch of 2 micro-batches of 1 x sequence 64' "$table" || fail "no global batch of 2 in $table"
  grep -Eq '^\| MFU \| [0-9.]+% of the dense peak \([0-9.]+ TFLOP/s.*; [0-9.]+% of the measured GEMM rate \([0-9.]+ TFLOP/s' "$table" || fail "no MFU in $table"
  grep -Eq '^\| peak device memory \| [0-9.]+ (GiB|MiB)' "$table" || fail "no peak device memory in $table"
  grep -Eq "^\| planner's prediction \| [0-9.]+ (GiB|MiB)" "$table" || fail "no planner's prediction in $table"
  grep -Eq '^\| measured / predicted \| [0-9]+\.[0-9]{3} \|' "$table" || fail "no measured/predicted ratio in $table"
  grep -Eq "^\| model \| tiny layer shapes, $layers of 2 layers" "$table" || fail "expected $layers of 2 layers in $table"
  grep -q "train: passed" "$log" || fail "the summary does not say the step passed"
}

OUT=$tmp/full bash "$script" "${args[@]}" >"$tmp/full.log" 2>&1 || { cat "$tmp/full.log"; fail "gpu-check.sh (room for all layers)"; }
cat "$tmp/full.log"
check_table "$tmp/full.log" "$tmp/full/gpu-check/train-table.md" 2
# The run's last table (summary.md) carries the training step's numbers.
grep -Eq '^\| training tokens/s \| [0-9]+ ' "$tmp/full/gpu-check/summary.md" || fail "no tokens/s in summary.md"
grep -Eq '^\| device peak / planner.s prediction \| [0-9]+\.[0-9]{3} ' "$tmp/full/gpu-check/summary.md" ||
  fail "no peak/prediction ratio in summary.md"
grep -q "all 2 layers fit by the planner" "$tmp/full.log" || fail "the full-model case does not say why"

# The planner's totals for 1 and 2 layers; a device between them holds 1 layer.
total() {
  "$lt" plan --hostfile <(echo "localhost slots=1   # gpu=H100-SXM5-80GB") --model-config tiny --n-layers "$1" \
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
echo "PASS: training step tables with 2 and 1 layers, and after an out-of-memory retry"
