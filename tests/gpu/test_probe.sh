#!/usr/bin/env bash
# GpuCheck.probe_then_no_device: scripts/gpu-check.sh on a machine without an NVIDIA driver prints
# its probe (where each CUDA library was found, host memory, cores), writes it to probe.txt, says
# "no GPU", and ends with the summary table (every step SKIP, no CUDA device; also summary.md) and
# exit status 2, all within 10 s.
#   test_probe.sh GPU_CHECK_SH
set -euo pipefail
script=$1
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
if command -v nvidia-smi >/dev/null; then
  echo "nvidia-smi is here: this test is for machines without a driver"
  exit 77
fi
start=$SECONDS rc=0
OUT=$tmp/out bash "$script" >"$tmp/log" 2>&1 || rc=$?
took=$((SECONDS - start))
cat "$tmp/log"
((rc == 2)) || fail "exit status $rc, expected 2 (no GPU)"
((took <= 10)) || fail "took $took s, more than 10"
probe=$tmp/out/gpu-check/probe.txt
[ -s "$probe" ] || fail "no $probe"
for lib in cuBLAS cuBLASLt cuDNN NCCL; do
  grep -Eq "^  $lib: (not found|/.* \(lib)" "$probe" || fail "the probe does not say where $lib is"
done
grep -q '^  nvidia-smi: not found' "$probe" || fail "the probe does not say the driver is missing"
grep -Eq '^  MemTotal: [0-9.]+ GiB' "$probe" || fail "no memory in the probe"
grep -Eq '^  cores: [0-9]+' "$probe" || fail "no cores in the probe"
grep -q 'no GPU' "$tmp/log" || fail "no 'no GPU' message"
summary=$tmp/out/gpu-check/summary.md
[ -s "$summary" ] || fail "no $summary"
n=$(wc -l <"$summary")
tail -n "$n" "$tmp/log" | diff "$summary" - || fail "the log does not end with the summary table"
for step in kernels zero train; do
  grep -q "^| step $step (0 s) | SKIP (no CUDA device: nvidia-smi not found" "$summary" || fail "the summary does not skip $step"
done
echo "ok ($took s)"
