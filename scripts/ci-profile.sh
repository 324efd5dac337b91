#!/usr/bin/env bash
# Where a run of scripts/test.sh (CI's run) spent its time, from what that run leaves behind in
# ${LT_PROFILE_DIR:-build/ci-profile}: its stages' wall times (stages.tsv), the build logs of Ninja
# (.ninja_log of build and build-asan: every compile and link with its start and end) and the CTest
# output of each test stage (one "Passed  12.34 sec" line per test). Prints
#   1. the stages: install, configure, build, tests, sanitizer build, sanitizer tests, in seconds;
#   2. each build by kind (nvcc device code, simulator, tests, C++ core, fuzz) and its 12 costliest
#      targets: CPU seconds summed over the target's compiles and its link, and the longest step;
#   3. each test stage: wall time against its tests' summed time (how well they packed),
#      the time of the tests CTest runs alone (RUN_SERIAL), the 25 costliest tests and the families
#      (gtest suite, with the Reverse./Random./Asan. prefixes) by summed time.
# Usage: scripts/ci-profile.sh [PROFILE_DIR]   (default build/ci-profile; the Ninja logs are the
# copies test.sh leaves there, else build/.ninja_log and build-asan/.ninja_log; a log's figures are
# those of a cold build: Ninja times each run from its own start)
#        scripts/ci-profile.sh --cost-data TESTS_LOG > tests/ctest-costs.txt
# writes the tests' times of a test stage's log in CTest's cost-data format: test.sh gives CTest
# that file in a new build folder, so that a cold run starts the costliest tests first.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --cost-data ]]; then
  awk '/ Test +#[0-9]+: / && /Passed/ {
         line = $0; sub(/.*Test +#[0-9]+: /, "", line); split(line, parts, " ")
         if (match($0, /[0-9.]+ sec/)) printf "%s 1 %s\n", parts[1], substr($0, RSTART, RLENGTH - 4)
       }' "${2:?--cost-data needs a test log}" | sort
  echo "---"
  exit 0
fi
dir=${1:-${LT_PROFILE_DIR:-build/ci-profile}}
logs=("$dir"/*.ninja_log)
[[ -f ${logs[0]} ]] || logs=(build/.ninja_log build-asan/.ninja_log)

if [[ -f "$dir/stages.tsv" ]]; then
  echo "== stages (wall seconds) =="
  # A stage run beside others (third field "beside") is not added to the total: its time is theirs.
  awk -F'\t' '$3 == "beside" { printf "  %-24s %8.1f  (beside the stages below it, at idle priority)\n", $1, $2; next }
               { printf "  %-24s %8.1f\n", $1, $2; t += $2 } END { printf "  %-24s %8.1f  (%.1f min)\n", "total", t, t / 60 }' \
    "$dir/stages.tsv"
  echo
fi

# A Ninja log: "start end mtime output hash" in ms, the newest line of an output wins; the outputs of
# one command (same start, end and hash) count once. The target of an object is the
# CMakeFiles/<target>.dir folder it is built in; a link's output is the target.
build_profile() {
  local log=$1
  [[ -f $log ]] || { echo "== $log: none (configured with another generator?) =="; echo; return; }
  echo "== build: $log =="
  awk -F'\t' '
    NR == 1 || /^#/ { next }
    { last[$4] = $1 "\t" $2; key[$4] = $1 " " $2 " " $5 }
    END {
      for (out in last) {
        if (key[out] in seen) continue
        seen[key[out]] = 1; steps++
        split(last[out], se, "\t"); s = se[1] / 1000; e = se[2] / 1000; d = e - s
        if (first == "" || s < first) first = s
        if (e > end) end = e
        t = out
        if (match(t, /CMakeFiles\/[^\/]+\.dir\//)) { t = substr(t, RSTART + 11, RLENGTH - 16) }
        else { sub(/.*\//, "", t); sub(/^lib/, "", t); sub(/\.a$/, "", t) }
        kind = "C++"
        if (out ~ /\.cu\.o$/) kind = "nvcc"
        else if (t ~ /sim/) kind = "simulator"
        else if (t ~ /^fuzz_/) kind = "fuzz"
        else if (t ~ /test|canary/) kind = "tests"
        cpu[t] += d; n[t]++; if (d > longest[t]) { longest[t] = d; longname[t] = out }
        tkind[t] = kind; kcpu[kind] += d; kn[kind]++; total += d
      }
      printf "  %.1f CPU s in %d steps; %.1f s from the first step'"'"'s start to the last'"'"'s end\n",
             total, steps, end - first
      printf "  %-10s %8s %6s\n", "kind", "CPU s", "steps"
      for (k in kcpu) printf "  %-10s %8.1f %6d\n", k, kcpu[k], kn[k] | "sort -k2 -nr"
      close("sort -k2 -nr")
      printf "  %-34s %-9s %7s %5s  %s\n", "target", "kind", "CPU s", "steps", "longest step"
      for (t in cpu) {
        ln = longname[t]; sub(/.*\//, "", ln)
        printf "  %-34s %-9s %7.1f %5d  %.1f s %s\n", t, tkind[t], cpu[t], n[t], longest[t], ln | "sort -k3 -nr | head -12"
      }
      close("sort -k3 -nr | head -12")
    }' "$log"
  echo
}
for log in "${logs[@]}"; do build_profile "$log"; done

# CTest's console lines: "  12/713 Test  #40: Name ........   Passed   12.34 sec" (or Failed,
# Not Run, ***Timeout ...); RUN_SERIAL tests are listed in the stage's serial.txt when test.sh saw them.
test_profile() {
  local log=$1 name
  name=$(basename "$log" .log)
  echo "== tests: $name =="
  local wall
  wall=$(awk -F'\t' -v s="$name" '$1 == s { print $2 }' "$dir/stages.tsv" 2>/dev/null | tail -1)
  awk -v wall="${wall:-0}" -v serial_file="$dir/$name.serial.txt" '
    BEGIN { while ((getline l < serial_file) > 0) serial[l] = 1 }
    / Test +#[0-9]+: / {
      line = $0; sub(/.*Test +#[0-9]+: /, "", line)
      split(line, parts, " "); t = parts[1]
      if (!match($0, /[0-9.]+ sec/)) next
      sec = substr($0, RSTART, RLENGTH - 4) + 0
      status = $0 ~ /Passed/ ? "" : ($0 ~ /Skipped|Not Run/ ? " (skipped)" : " (FAILED)")
      time[t] = sec; st[t] = status; total += sec; n++
      if (t in serial) stotal += sec
      fam = t; if (match(fam, /^(Reverse|Random|Asan)\./)) { p = substr(fam, 1, RLENGTH); fam = substr(fam, RLENGTH + 1) } else p = ""
      sub(/\..*/, "", fam); fam = p fam; ftime[fam] += sec; fn[fam]++
    }
    END {
      printf "  %d tests, %.1f s summed", n, total
      if (wall > 0) printf "; stage wall %.1f s (summed / wall %.2f)", wall, total / wall
      if (length(serial)) printf "; RUN_SERIAL tests %.1f s", stotal
      printf "\n  costliest tests:\n"
      for (t in time) printf "  %8.1f  %s%s%s\n", time[t], t, (t in serial ? " [serial]" : ""), st[t] | "sort -nr | head -25"
      close("sort -nr | head -25")
      printf "  families (summed s, tests):\n"
      for (f in ftime) printf "  %8.1f %4d  %s\n", ftime[f], fn[f], f | "sort -nr | head -30"
      close("sort -nr | head -30")
    }' "$log"
  echo
}
for log in "$dir"/tests-*.log; do
  [[ -f $log ]] && test_profile "$log"
done
