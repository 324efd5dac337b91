# shellcheck shell=bash
# The stop-signal cases shared by test_signals.sh (mpirun) and test_signals_srun.sh (srun): a
# training run in the background, a signal once it has logged a step, then the exit status, the
# published checkpoint and a resume from it are checked, and the case is recorded for the fault
# suite's summary (tests/faults/fault_cases.h, summarize.sh).
#
# The sourcing script sets BIN, TRAIN (the train command line without its outputs), RESULTS_FILE
# (the .tsv of recorded cases, or empty) and defines
#   launch NAME HOW       starts the run of case NAME in the background, its outputs under NAME/
#                         (--checkpoint-dir NAME/ckpt --metrics NAME/metrics.jsonl), its log in
#                         NAME/log; the launcher's pid goes to LAUNCH_PID
#   deliver HOW PID RANKS NAME sends the signal of case NAME (PID: the launcher, RANKS: the ranks' pids)
# and calls run_case NAME EXPECTED_STATUS HOW for each case, then signal_cases_end.

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
if [[ -n ${RESULTS_FILE:-} ]]; then mkdir -p "$(dirname "$RESULTS_FILE")" && : >"$RESULTS_FILE"; fi
record() {
  [[ -n ${RESULTS_FILE:-} ]] && printf '%s\t%s\t%s\n' "$1" "signal: $2" "$3" >>"$RESULTS_FILE"
  return 0
}

# Waits until the run in $1 has logged an optimizer step (the signal then lands inside the loop).
wait_for_step() {
  for _ in $(seq 600); do
    grep -q '"type":"step"' "$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# The pids of the ranks of case $1 (the llamatrain processes writing to its checkpoint dir).
rank_pids() {
  pgrep -f -- "--checkpoint-dir $1/ckpt" | while read -r p; do
    [[ $(cat /proc/"$p"/comm 2>/dev/null) == llamatrain ]] && echo "$p"
  done
}

# Checks the checkpoint of case $1 and resumes it for one more step.
check_checkpoint() {
  local dir=$1/ckpt
  if [[ ! -f $dir/latest ]]; then fail "$1: no checkpoint published"; return; fi
  local step
  step=$(tr -d '[:space:]' <"$dir/latest")
  [[ -f $dir/$step/checkpoint.h5 || -d $dir/$step ]] || fail "$1: latest names $step, which is missing"
  ls -a "$dir" | grep -q '\.tmp' && fail "$1: unpublished checkpoint left: $(ls -a "$dir")"
  local n=$((10#${step#step-}))
  if ! "$BIN" "${TRAIN[@]/100000/$((n + 1))}" --checkpoint-dir "$dir" --resume auto >"$1/resume.log" 2>&1; then
    fail "$1: resume failed: $(tail -3 "$1/resume.log")"
  fi
  grep -q "resum" "$1/resume.log" || fail "$1: the rerun did not resume: $(head -3 "$1/resume.log")"
}

# run_case NAME EXPECTED_STATUS HOW: launches, signals once a step is done, checks and records.
run_case() {
  local name=$1 expected=$2 how=$3
  mkdir -p "$name"
  launch "$name" "$how"
  local pid=$LAUNCH_PID
  if ! wait_for_step "$name"; then
    fail "$name: no step within 60 s: $(tail -5 "$name/log")"
    record hang "$name" "no step within 60 s"
    kill -KILL "$pid" 2>/dev/null
    return
  fi
  local ranks
  ranks=$(rank_pids "$name")
  deliver "$how" "$pid" "$ranks" "$name"
  # A run the signal did not stop would hold the test until CTest's timeout: 120 s, then SIGKILL.
  (
    sleep 120 &
    trap 'kill $! 2>/dev/null; exit' TERM
    wait $! && echo "$name: still running 120 s after the signal" >"$name/hung" && kill -KILL "$pid" $ranks
  ) 2>/dev/null &
  local guard=$!
  wait "$pid"
  local status=$?
  kill "$guard" 2>/dev/null
  if [[ -f $name/hung ]]; then
    fail "$(cat "$name/hung")"
    record hang "$name" "still running 120 s after the signal"
    return
  fi
  local before=$failures
  if [[ $status != "$expected" ]]; then
    fail "$name: exit status $status, expected $expected: $(tail -5 "$name/log")"
  else
    echo "ok: $name: exit status $status"
  fi
  check_checkpoint "$name"
  if ((failures == before)); then
    record recovered "$name" "status $status, checkpoint published and resumed"
  elif ((status >= 128)); then
    record crash "$name" "status $status"
  else
    record unclear "$name" "status $status (expected $expected) or no usable checkpoint"
  fi
}

# The script's exit: 1 when a case failed.
signal_cases_end() {
  if ((failures)); then
    echo "$failures failure(s)"
    return 1
  fi
  echo "all signal cases passed"
}
