#!/usr/bin/env bash
# GpuCheck.rehearsal and GpuCheck.rehearsal_with_failures: scripts/gpu-check.sh end to end, every step,
# on the CUDA simulator with small shapes: the kernel checks (KERNELS_PROGRAM=llamatrain_gpu_checks_sim,
# tests/gpu/sim/checks_on_sim.cpp; no benchmarks there), the sharded stages and the training step
# (--train-device cuda-sim, `tiny` at sequence 64, 4 steps of 2 micro-batches).
#   test_rehearsal.sh clean GPU_CHECK_SH CHECKS_SIM LLAMATRAIN
#       Every check of ours PASSes, cuDNN's two are SKIPs with their reason (there is no cuDNN on the
#       simulator: the rehearsal of a GPU machine without it), each once in kernel-checks.tsv; the
#       zero and train tables hold every row; the log's last lines are the summary table, every
#       step PASS, the attention rows "not measured", the training numbers read from its table;
#       exit status 0.
#   test_rehearsal.sh failures GPU_CHECK_SH CHECKS_SIM LLAMATRAIN
#       A forced failure in each step that can have one: every device-to-host copy corrupted
#       (LT_GPUCHECK_CORRUPT=1: every check must FAIL, so the checks can fail) and the runtime
#       poisoned as attention_forward begins, as an illegal address poisons a context
#       (LT_GPUCHECK_STICKY_IN): the program ends with status 4 naming it, the script starts it
#       again after it and every check still lands in kernel-checks.tsv exactly once (18 FAIL, 2
#       SKIP); the zero step's cap too small for its runs (a stand-in llamatrain whose ZeRO 2 run
#       hangs, a 25 s cap): TIMED OUT; the training step after them still runs and its table
#       lands; the summary names each failure; exit status 3.
set -euo pipefail
mode=$1 script=$2 checks_sim=$3 llamatrain=$4
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
mkdir "$tmp/bin"
ln -s "$checks_sim" "$tmp/bin/llamatrain_gpu_checks_sim"
ln -s "$llamatrain" "$tmp/bin/llamatrain"
export KERNELS_PROGRAM=llamatrain_gpu_checks_sim OUT=$tmp/out
# The steps' caps are sized for a GPU; the simulator beside other tests needs more (the budget too).
export GPU_CHECK_KERNELS_CAP=600 GPU_CHECK_ZERO_CAP=600 GPU_CHECK_TRAIN_CAP=600
args=(--bin-dir "$tmp/bin" --train-device cuda-sim --train-model tiny --train-seq-len 64 --train-steps 4
  --train-micro-batches 2 --budget 2000)
case $mode in
  clean) want_rc=0 want_fail=0 want_pass=18 ;;
  failures)
    export LT_GPUCHECK_CORRUPT=1 LT_GPUCHECK_STICKY_IN=attention_forward GPU_CHECK_ZERO_CAP=25
    want_rc=3 want_fail=18 want_pass=0
    rm "$tmp/bin/llamatrain"
    cat >"$tmp/bin/llamatrain" <<FAKE
#!/usr/bin/env bash
# The rehearsal's llamatrain: the zero step's ZeRO 2 run hangs (until its cap ends it); the rest is real.
if [ "\$1" = train ] && [[ " \$* " == *" --zero 2 "* ]]; then exec sleep 300; fi
exec "$llamatrain" "\$@"
FAKE
    chmod +x "$tmp/bin/llamatrain"
    ;;
  *) fail "mode: clean or failures, not '$mode'" ;;
esac
rc=0
bash "$script" "${args[@]}" >"$tmp/log" 2>&1 || rc=$?
res=$OUT/gpu-check
summary=$res/summary.md
grep -E '^(PASS|FAIL|SKIP) |^== |STICKY|^\|' "$tmp/log"
[ -s "$res/probe.txt" ] || fail "no probe.txt"
[ -s "$summary" ] || { cat "$tmp/log"; fail "no $summary"; }
((rc == want_rc)) || { cat "$tmp/log"; fail "gpu-check.sh exited $rc, expected $want_rc"; }
# The summary table is the last thing printed.
n=$(wc -l <"$summary")
tail -n "$n" "$tmp/log" | diff "$summary" - || fail "the log does not end with the summary table"

# Kernels: every check once, whatever happened.
tsv=$res/kernel-checks.tsv
[ -s "$tsv" ] || fail "no $tsv"
n_pass=$(grep -c '^PASS' "$tsv" || true) n_fail=$(grep -c '^FAIL' "$tsv" || true) n_skip=$(grep -c '^SKIP' "$tsv" || true)
echo "kernel-checks.tsv: $n_pass PASS, $n_fail FAIL, $n_skip SKIP"
((n_pass == want_pass && n_fail == want_fail && n_skip == 2)) ||
  fail "expected $want_pass PASS, $want_fail FAIL and 2 SKIP (cuDNN's)"
[ "$(grep -cE $'^SKIP\tcudnn_[a-z_]+\t.+' "$tsv")" = 2 ] || fail "cuDNN's SKIPs do not say why"
dups=$(cut -f2 "$tsv" | sort | uniq -d)
[ -z "$dups" ] || fail "checks recorded twice: $dups"
"$checks_sim" --list | sed 's/^check //' | sort >"$tmp/names"
cut -f2 "$tsv" | sort | diff "$tmp/names" - || fail "kernel-checks.tsv does not hold every check"
# No benchmarks on the simulator: the summary says so rather than showing nothing.
[ "$(summary_row "$summary" "attention forward T=2048")" = "not measured" ] ||
  fail "summary.md does not say the attention rows were not measured"

# Training: its table and the summary's numbers from it, in both runs.
check_train_table "$res/train-table.md" 2 2
grep -q "all 2 layers fit by the planner" "$tmp/log" || fail "the training step does not say why 2 layers"
[ "$(summary_row "$summary" "step train")" = PASS ] || fail "the summary does not say the training step passed"
grep -Eq '^\| training tokens/s \| [0-9]+ ' "$summary" || fail "no tokens/s in summary.md"
grep -Eq '^\| optimizer share of a training step \| [0-9.]+% of the step' "$summary" || fail "no optimizer share in summary.md"
grep -Eq '^\| device peak / planner.s prediction \| [0-9]+\.[0-9]{3} ' "$summary" || fail "no peak/prediction ratio in summary.md"

if [ "$mode" = clean ]; then
  [ "$(summary_row "$summary" "step kernels")" = PASS ] || fail "the summary does not say the kernels step passed"
  check_zero_table "$res/zero-table.md"
  [ "$(summary_row "$summary" "step zero")" = PASS ] || fail "the summary does not say the zero step passed"
else
  grep -q '^llamatrain_gpu_check: STICKY checks attention_forward: ' "$tmp/log" || fail "no STICKY line naming attention_forward"
  grep -q 'starting again after it' "$tmp/log" || fail "the step did not start the program again"
  summary_row "$summary" "step kernels" | grep -q "^ERROR (sticky CUDA error in checks attention_forward; 18 check(s) FAILED" ||
    fail "the summary does not name the sticky family and the failures"
  grep -q $'^FAIL\tattention_forward\t.*exception' "$tsv" || fail "attention_forward is not recorded as failed by its exception"
  summary_row "$summary" "step zero" | grep -q "^TIMED OUT (llamatrain train --device after [0-9]* s" ||
    fail "the summary does not say the zero step timed out"
  [ ! -e "$res/zero-table.md" ] || fail "a zero table from runs that did not finish"
fi
echo "ok"
