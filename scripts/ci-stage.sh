# Sourced by scripts/test.sh and scripts/test-sanitize.sh: each stage of a test run timed into
# $LT_PROFILE_DIR/stages.tsv, and CTest's output of a test stage kept beside it, for
# scripts/ci-profile.sh. The folder is emptied by the run that starts it (the outermost script).
LT_PROFILE_DIR=${LT_PROFILE_DIR:-$PWD/${BUILD_DIR:-build}/ci-profile}
if [[ -z "${LT_PROFILE_STARTED:-}" ]]; then
  rm -rf "$LT_PROFILE_DIR"
  export LT_PROFILE_STARTED=1
fi
export LT_PROFILE_DIR
mkdir -p "$LT_PROFILE_DIR"

# Threads that wait at an OpenMP barrier sleep instead of spinning. CTest runs two or three tests at a time on
# two cores, each with two threads (and mpirun tests with several ranks): spinning threads then
# take the cores from the threads they wait for. Measured on 2 cores with the suite loading the
# machine: a 1-step `train` of the tiny model took 114.7 s with the default policy, 1.9 s with
# PASSIVE. The policy changes only how threads wait, never a result.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

# stage NAME COMMAND...: runs COMMAND and appends "NAME<TAB>seconds" (set -e stops the run on failure).
stage() {
  local name=$1 t0=$EPOCHREALTIME
  shift
  "$@"
  awk -v n="$name" -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%s\t%.1f\n", n, b - a }' >>"$LT_PROFILE_DIR/stages.tsv"
}

# stage_beside NAME LOG COMMAND...: starts COMMAND in the background, in a process group of its own,
# at idle CPU priority (SCHED_IDLE: it gets a core only when nothing else wants one), its output in
# LOG; its wall time goes to stages.tsv marked "beside" (not added to the total). stage_join NAME
# waits for it: the wait is stage NAME; a failure prints LOG and stops the run. A run that stops
# earlier stops it too. One at a time.
stage_beside() {
  local name=$1 log=$2
  shift 2
  local idle=(chrt --idle 0)
  command -v chrt >/dev/null || idle=(nice -n 19)
  setsid bash -c 'name=$1 stages=$2; shift 2; t0=$EPOCHREALTIME; rc=0; "$@" || rc=$?
    awk -v n="$name" -v a="$t0" -v b="$EPOCHREALTIME" '"'"'BEGIN { printf "%s\t%.1f\tbeside\n", n, b - a }'"'"' >>"$stages"
    exit $rc' _ "$name" "$LT_PROFILE_DIR/stages.tsv" "${idle[@]}" "$@" >"$log" 2>&1 &
  LT_BESIDE_PID=$!
  LT_BESIDE_LOG=$log
  trap 'kill -- -$LT_BESIDE_PID 2>/dev/null || true' EXIT
}
stage_join() {
  stage "$1" join_beside
}
join_beside() {
  local rc=0
  wait "$LT_BESIDE_PID" || rc=$?
  trap - EXIT
  if ((rc != 0)); then
    cat "$LT_BESIDE_LOG"
    echo "the background stage failed (exit status $rc): $LT_BESIDE_LOG" >&2
    return "$rc"
  fi
  tail -n 2 "$LT_BESIDE_LOG"
}

# stage_tests NAME BUILD_DIR CTEST_ARGS...: CTest in BUILD_DIR, its output also in NAME.log, and the
# names of the tests CTest runs alone (RUN_SERIAL) in NAME.serial.txt.
stage_tests() {
  local name=$1 dir=$2
  shift 2
  # CTest starts the costliest tests first when it knows their times; a new build folder has none,
  # so it gets the committed ones (scripts/ci-profile.sh --cost-data writes them).
  local costs=$dir/Testing/Temporary/CTestCostData.txt
  if [[ ! -f $costs && -f tests/ctest-costs.txt ]]; then
    mkdir -p "$(dirname "$costs")"
    cp tests/ctest-costs.txt "$costs"
  fi
  if command -v python3 >/dev/null; then
    ctest --test-dir "$dir" --show-only=json-v1 "$@" 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin).get("tests", []):
    if any(p["name"] == "RUN_SERIAL" and p["value"] for p in t.get("properties", [])): print(t["name"])' \
      >"$LT_PROFILE_DIR/$name.serial.txt" || true
  fi
  stage "$name" ctest_logged "$LT_PROFILE_DIR/$name.log" --test-dir "$dir" "$@"
}
ctest_logged() {
  local log=$1
  shift
  ctest "$@" | tee "$log"
}

# The build logs beside the stage times, and the profile's tables at the end of the run.
stage_summary() {
  local b
  for b in "${BUILD_DIR:-build}" "${ASAN_BUILD_DIR:-build-asan}"; do
    [[ -f $b/.ninja_log ]] && cp "$b/.ninja_log" "$LT_PROFILE_DIR/$(basename "$b").ninja_log"
  done
  echo "== where the time went: bash scripts/ci-profile.sh $LT_PROFILE_DIR =="
  bash scripts/ci-profile.sh "$LT_PROFILE_DIR" | awk '/^== stages/,/^$/'
}
