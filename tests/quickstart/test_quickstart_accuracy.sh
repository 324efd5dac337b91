#!/usr/bin/env bash
# Quickstart.accuracy (label slow; scripts/test.sh runs it with LT_SLOW=1): scripts/quickstart.sh
# itself, with the built binary, its epochs (EPOCHS to change them) and the training seed SEED
# (default 1; both printed): the held-out yes/no/maybe accuracy and macro-F1 after training must both
# reach 0.9 (docs/benchmarks.md, "The quick start", has the range measured across seeds and machines).
#   test_quickstart_accuracy.sh QUICKSTART_SH LLAMATRAIN
set -euo pipefail
script=$1 bin=$2
seed=${SEED:-1} epochs=${EPOCHS:-$(sed -n 's/^EPOCHS=${EPOCHS:-\([0-9]*\)}$/\1/p' "$script")}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "quickstart: seed $seed, $epochs epochs, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
QUICKSTART_BIN=$bin RUN_DIR=$tmp/run EPOCHS=$epochs SEED=$seed bash "$script" >"$tmp/log" 2>&1 || {
  cat "$tmp/log"
  echo "FAILED: quickstart.sh exited non-zero"
  exit 1
}
# The line after "== test accuracy after training ==":
#   pubmedqa: 400 examples, accuracy 0.9975, macro-F1 0.9975 (...)
line=$(sed -n '/^== test accuracy after training ==$/,$p' "$tmp/log" | grep -m1 '^pubmedqa: ') || true
[[ -n $line ]] || { cat "$tmp/log"; echo "FAILED: no accuracy line after training"; exit 1; }
echo "$line"
sed -n '/^== test accuracy after training ==$/,/^== a sample answer ==$/p' "$tmp/log" | grep -A3 '^confusion'
read -r acc f1 < <(sed -E 's/.*accuracy ([0-9.]+), macro-F1 ([0-9.]+).*/\1 \2/' <<<"$line")
if awk -v a="$acc" -v f="$f1" 'BEGIN { exit !(a >= 0.9 && f >= 0.9) }'; then
  echo "PASS: accuracy $acc, macro-F1 $f1 (both >= 0.9)"
else
  echo "FAILED: accuracy $acc, macro-F1 $f1; both must be >= 0.9"
  exit 1
fi
