#!/usr/bin/env bash
# GpuCheck.zero_step: the sharded stages' step of scripts/gpu-check.sh on the CUDA simulator
# (--train-device cuda-sim, `tiny` at sequence 64) with a check that must fail: a stand-in
# llamatrain gives the ZeRO 2 run --lr 1e-2 instead of 1e-4, whose losses then leave ZeRO 1's; the
# table says the checks failed, the step FAILs and the script exits 1. (The passing step, its table
# of ZeRO 1, 2, 3 and 3 with --offload-optimizer: the whole script's rehearsal, test_rehearsal.sh.)
#   test_zero_step.sh GPU_CHECK_SH BUILD_DIR (holding llamatrain)
set -euo pipefail
script=$1
bin_dir=$2
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
# The simulator's four runs take 25 s on an idle 2-core machine and several times that beside other
# tests: the step's 80 s (sized for a GPU) is raised here.
export GPU_CHECK_ZERO_CAP=400
args=(--steps zero --bin-dir "$bin_dir" --train-device cuda-sim --train-model tiny --train-seq-len 64)

# The ZeRO 2 run with a 100x learning rate: its losses must leave ZeRO 1's and the step fail.
mkdir "$tmp/fake"
cat >"$tmp/fake/llamatrain" <<FAKE
#!/usr/bin/env bash
a=("\$@")
if [ "\$1" = train ] && [[ " \$* " == *" --zero 2 "* ]]; then
  for i in "\${!a[@]}"; do [ "\${a[\$i]}" = --lr ] && a[\$((i + 1))]=1e-2; done
fi
exec "$bin_dir/llamatrain" "\${a[@]}"
FAKE
chmod +x "$tmp/fake/llamatrain"
args[3]=$tmp/fake  # --bin-dir
rc=0
OUT=$tmp/bad bash "$script" "${args[@]}" >"$tmp/bad.log" 2>&1 || rc=$?
cat "$tmp/bad/gpu-check/zero-table.md"
((rc == 1)) || { cat "$tmp/bad.log"; fail "expected exit status 1 from a failed check, got $rc"; }
grep -q "checks: .*: FAILED" "$tmp/bad/gpu-check/zero-table.md" || fail "the table does not say the checks failed"
summary_row "$tmp/bad/gpu-check/summary.md" "step zero" | grep -q "^FAIL (a check failed" ||
  fail "the summary does not say the step failed"
echo "PASS: a failed check of the zero step reported"
