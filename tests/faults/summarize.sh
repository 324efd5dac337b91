#!/usr/bin/env bash
# Sums the fault suite's classified cases (tests/faults/fault_cases.h): every line of
# RESULTS_DIR/*.tsv is "outcome<TAB>case<TAB>detail" with outcome clear, recovered, unclear, crash,
# hang or silent. Prints a line per test, the cases that went wrong, and the totals
#   fault suite: N cases, C clear errors, 0 crashes, 0 hangs, 0 silent-wrong
# and fails unless crashes, hangs, silent-wrong and unclear messages are all 0 (and some case ran).
# Usage: summarize.sh RESULTS_DIR
set -uo pipefail
dir=$1
shopt -s nullglob
files=("$dir"/*.tsv)
if ((${#files[@]} == 0)); then
  echo "fault suite: no results in $dir (run ctest -L faults)"
  exit 1
fi
declare -A total=([clear]=0 [recovered]=0 [unclear]=0 [crash]=0 [hang]=0 [silent]=0)
problems=()
for f in "${files[@]}"; do
  declare -A n=([clear]=0 [recovered]=0 [unclear]=0 [crash]=0 [hang]=0 [silent]=0)
  while IFS=$'\t' read -r outcome name detail; do
    [[ -z $outcome ]] && continue
    if [[ -z ${n[$outcome]+x} ]]; then outcome=unclear; fi
    n[$outcome]=$((n[$outcome] + 1))
    total[$outcome]=$((total[$outcome] + 1))
    [[ $outcome == clear || $outcome == recovered ]] || problems+=("$outcome: $(basename "$f" .tsv): $name: $detail")
  done <"$f"
  printf '%-72s %3d cases: %d clear, %d recovered, %d unclear, %d crash, %d hang, %d silent\n' \
    "$(basename "$f" .tsv)" $((n[clear] + n[recovered] + n[unclear] + n[crash] + n[hang] + n[silent])) \
    "${n[clear]}" "${n[recovered]}" "${n[unclear]}" "${n[crash]}" "${n[hang]}" "${n[silent]}"
  unset n
done
for p in "${problems[@]}"; do echo "  $p"; done
cases=$((total[clear] + total[recovered] + total[unclear] + total[crash] + total[hang] + total[silent]))
echo "fault suite: $cases cases, ${total[clear]} clear errors, ${total[crash]} crashes, ${total[hang]} hangs," \
  "${total[silent]} silent-wrong"
echo "  (the other $((cases - total[clear])): ${total[recovered]} recovered exactly without an error," \
  "${total[unclear]} failed cleanly but without the expected status or message)"
if ((total[crash] + total[hang] + total[silent] + total[unclear] > 0)); then
  echo "FAIL: crashes, hangs, silent-wrong results and unclear messages must all be 0"
  exit 1
fi
