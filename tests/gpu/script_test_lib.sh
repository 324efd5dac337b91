# shellcheck shell=bash
# Sourced by the tests of scripts/gpu-check.sh (test_*.sh here): $tmp, a scratch directory removed
# when the test exits; fail MESSAGE, which says FAIL and ends the test with status 1; and the checks
# of the steps' tables that more than one test makes.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# check_zero_table TABLE: a row per ZeRO run (stage, option, first and last loss, worst difference
# from ZeRO 1, tokens/s, device peak, memory table, their ratio) and the checks passed.
check_zero_table() {
  local table=$1 row
  [ -s "$table" ] || fail "no $table"
  for row in '1 \| -' '2 \| -' '3 \| -' '3 \| --offload-optimizer' '1 \| --lora-rank 16' '3 \| --lora-rank 16'; do
    grep -Eq "^\| $row \| [0-9.]+, [0-9.]+ \| [0-9.]+e[-+][0-9]+ \| [0-9]+ \| [0-9.]+ MiB \| [0-9.]+ MiB \| [0-9.]+ \|$" "$table" ||
      fail "no row '$row' in $table"
  done
  grep -q "checks: .*: passed" "$table" || fail "the table does not say the checks passed"
}

# check_train_table TABLE LAYERS MICRO_BATCHES: the training step's rows, LAYERS of 2 layers of
# `tiny` trained with a global batch of MICRO_BATCHES sequences of 64.
check_train_table() {
  local table=$1 layers=$2 mb=$3
  [ -s "$table" ] || fail "no $table"
  grep -Eq '^\| tokens/s \| [0-9]+ ' "$table" || fail "no tokens/s in $table"
  grep -q "^| run | global batch of $mb micro-batches of 1 x sequence 64" "$table" || fail "no global batch of $mb in $table"
  grep -Eq '^\| optimizer share \| [0-9.]+% of the step \([0-9.]+ ms' "$table" || fail "no optimizer share in $table"
  grep -Eq '^\| MFU \| [0-9.]+% of the dense peak \([0-9.]+ TFLOP/s.*; [0-9.]+% of the measured GEMM rate \([0-9.]+ TFLOP/s' "$table" || fail "no MFU in $table"
  grep -Eq '^\| peak device memory \| [0-9.]+ (GiB|MiB)' "$table" || fail "no peak device memory in $table"
  grep -Eq "^\| planner's prediction \| [0-9.]+ (GiB|MiB)" "$table" || fail "no planner's prediction in $table"
  grep -Eq '^\| measured / predicted \| [0-9]+\.[0-9]{3} \|' "$table" || fail "no measured/predicted ratio in $table"
  grep -Eq "^\| model \| tiny layer shapes, $layers of 2 layers" "$table" || fail "expected $layers of 2 layers in $table"
}

# summary_row SUMMARY NAME: the second cell of the summary table's row NAME (a step: "step zero").
summary_row() {
  awk -F' *[|] *' -v k="$2" 'index($2, k) == 1 { print $3; exit }' "$1"
}
