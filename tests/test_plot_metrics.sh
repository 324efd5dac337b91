#!/usr/bin/env bash
# scripts/plot_metrics.py on the metrics of a real (tiny, 3-epoch) training run: the PNG is written,
# is a PNG and is not empty, and the script counted every step and epoch record; then malformed
# files must fail with the file and line named. Exit 77 (CTest: skipped) when PYTHON has no matplotlib.
# Usage: test_plot_metrics.sh LLAMATRAIN SOURCE_DIR PYTHON
set -uo pipefail
LLAMATRAIN="$1" SRC="$2" PYTHON="$3"
PLOT="$SRC/scripts/plot_metrics.py"
if ! "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  echo "SKIP: $PYTHON has no matplotlib (scripts/install-deps.sh --bench)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 60 question/answer records, enough for a tokenizer and a few steps per epoch.
for i in $(seq 1 60); do
  printf '{"question": "How many items does person %d hold?", "context": "Person %d holds %d items.", "answer": "%d items."}\n' \
    "$i" "$i" $((i % 7 + 2)) $((i % 7 + 2))
done >"$work/qa.jsonl"
"$LLAMATRAIN" prepare --qa "$work/qa.jsonl" --prompt-type 3 --vocab-size 300 --seq-len 64 --test-split 0.2 \
    --seed 1 --output "$work/qa.h5" >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; fail "prepare"; }
OMP_NUM_THREADS=1 "$LLAMATRAIN" train --model-config tiny --data "$work/qa.h5" --batch-size 4 --epochs 3 --lr 1e-3 \
    --warmup-steps 3 --seed 1 --no-progress --metrics "$work/m.jsonl" >"$work/train.log" 2>&1 \
    || { cat "$work/train.log"; fail "train"; }
n_steps=$(grep -c '"type":"step"' "$work/m.jsonl")
n_epochs=$(grep -c '"type":"epoch"' "$work/m.jsonl")
[[ "$n_epochs" == 3 && "$n_steps" -ge 6 ]] || fail "expected 3 epochs and >= 6 steps, got $n_epochs and $n_steps"

out=$("$PYTHON" "$PLOT" "$work/m.jsonl" -o "$work/m.png" 2>&1) || fail "plot_metrics.py failed: $out"
echo "$out"
[[ -s "$work/m.png" ]] || fail "no PNG written (or empty)"
[[ "$(head -c 8 "$work/m.png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] || fail "m.png is not a PNG"
[[ "$out" == *"($n_steps steps, 3 epochs)"* ]] || fail "expected '$n_steps steps, 3 epochs' in: $out"

# Malformed input: the error names the file and line, the exit status is 1 and no PNG appears.
expect_error() {  # file expected-substring
  local err rc
  err=$("$PYTHON" "$PLOT" "$1" -o "$work/bad.png" 2>&1); rc=$?
  [[ $rc == 1 ]] || fail "$1: exit status $rc, expected 1 (output: $err)"
  [[ "$err" == *"$2"* ]] || fail "$1: expected '$2' in: $err"
  [[ ! -e "$work/bad.png" ]] || fail "$1: a PNG was written for a malformed file"
  echo "ok: $err"
}
sed '5s/.*/{"type": "step", "loss": /' "$work/m.jsonl" >"$work/truncated.jsonl"
expect_error "$work/truncated.jsonl" "truncated.jsonl:5: not valid JSON"
sed '4s/"lr":/"learning_rate":/' "$work/m.jsonl" >"$work/no_lr.jsonl"
expect_error "$work/no_lr.jsonl" "no_lr.jsonl:4: step record: no field 'lr'"
sed '3s/.*/[1, 2]/' "$work/m.jsonl" >"$work/array.jsonl"
expect_error "$work/array.jsonl" "array.jsonl:3: not a JSON object"
echo "PASS"
