#!/usr/bin/env bash
# GpuCheck.checks_on_simulator and GpuCheck.checks_detect_corruption: scripts/gpu-check.sh's kernels
# step run end to end with the device program's checks on the CUDA simulator
# (KERNELS_PROGRAM=llamatrain_gpu_checks_sim, tests/gpu/sim/checks_on_sim.cpp).
#   test_kernels_step.sh clean GPU_CHECK_SH BIN_DIR
#       Every check of ours PASSes, cuDNN's two are SKIPs (no cuDNN on the simulator), each written
#       to kernel-checks.tsv; the summary says the step passed; exit status 0.
#   test_kernels_step.sh sticky GPU_CHECK_SH BIN_DIR
#       Every device-to-host copy corrupted (LT_GPUCHECK_CORRUPT=1: every check must FAIL, so the
#       checks can fail) and the runtime poisoned as attention_forward begins, as an illegal address
#       poisons a context (LT_GPUCHECK_STICKY_IN): the program ends with status 4 naming it, the
#       script starts it again after it, and every check still lands in kernel-checks.tsv exactly
#       once (16 FAIL, 2 SKIP); the summary names the sticky family; exit status 3.
set -euo pipefail
mode=$1 script=$2 bin_dir=$3
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
export KERNELS_PROGRAM=llamatrain_gpu_checks_sim OUT=$tmp/out
case $mode in
  clean) want_rc=0 want_fail=0 want_pass=16 ;;
  sticky)
    export LT_GPUCHECK_CORRUPT=1 LT_GPUCHECK_STICKY_IN=attention_forward
    want_rc=3 want_fail=16 want_pass=0
    ;;
  *) fail "mode: clean or sticky, not '$mode'" ;;
esac
rc=0
bash "$script" --steps kernels --bin-dir "$bin_dir" >"$tmp/log" 2>&1 || rc=$?
grep -E '^(PASS|FAIL|SKIP) |^== (kernels|gpu-check)|STICKY|^  kernels:' "$tmp/log"
tsv=$OUT/gpu-check/kernel-checks.tsv
[ -s "$tsv" ] || { cat "$tmp/log"; fail "no $tsv"; }
((rc == want_rc)) || fail "gpu-check.sh exited $rc, expected $want_rc"
n_pass=$(grep -c '^PASS' "$tsv" || true) n_fail=$(grep -c '^FAIL' "$tsv" || true) n_skip=$(grep -c '^SKIP' "$tsv" || true)
echo "kernel-checks.tsv: $n_pass PASS, $n_fail FAIL, $n_skip SKIP"
((n_pass == want_pass && n_fail == want_fail && n_skip == 2)) ||
  fail "expected $want_pass PASS, $want_fail FAIL and 2 SKIP (cuDNN's)"
dups=$(cut -f2 "$tsv" | sort | uniq -d)
[ -z "$dups" ] || fail "checks recorded twice: $dups"
"$bin_dir/llamatrain_gpu_checks_sim" --list | sed 's/^check //' | sort >"$tmp/names"
cut -f2 "$tsv" | sort | diff "$tmp/names" - || fail "kernel-checks.tsv does not hold every check"
if [ "$mode" = clean ]; then
  grep -q '^  kernels: passed$' "$tmp/log" || fail "the summary does not say the step passed"
  # No benchmarks on the simulator: the summary table says so rather than showing nothing.
  grep -q '^| attention forward T=2048 (TFLOP/s) | not measured | not measured |$' "$OUT/gpu-check/summary.md" ||
    fail "summary.md does not say the attention rows were not measured"
else
  grep -q '^llamatrain_gpu_check: STICKY checks attention_forward: ' "$tmp/log" || fail "no STICKY line naming attention_forward"
  grep -q 'starting again after it' "$tmp/log" || fail "the step did not start the program again"
  grep -q "^  kernels: ERROR (sticky CUDA error in checks attention_forward; 16 check(s) FAILED" "$tmp/log" ||
    fail "the summary does not name the sticky family and the failures"
  grep -q $'^FAIL\tattention_forward\t.*exception' "$tsv" || fail "attention_forward is not recorded as failed by its exception"
fi
echo "ok"
