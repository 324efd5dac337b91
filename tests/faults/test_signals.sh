#!/usr/bin/env bash
# Stop signals as schedulers send them, under mpirun -np 2 (see docs/usage.md, "Exit status"):
#   SIGUSR1 to mpirun (Open MPI forwards it)        -> checkpoint, mpirun exits 3
#   SIGTERM to one rank / to every rank             -> checkpoint, mpirun exits 3
#   SIGTERM to a job script that forwards SIGUSR1   -> checkpoint, the script exits 3
#   SIGTERM to a plain process (no mpirun)          -> checkpoint, exit 3
#   SIGTERM to mpirun itself                        -> checkpoint (given time before SIGKILL), but
#       mpirun exits 1: Open MPI 4's mpirun answers SIGTERM by killing the job (SIGCONT, then
#       SIGTERM and SIGKILL, each after odls_base_sigkill_timeout seconds, default 1) and sets its
#       own status to 1 whatever the ranks return. The test pins that documented behaviour.
# Each case checks that a checkpoint was published (`latest` names a complete step-N, no .tmp left)
# and that `--resume auto` continues from it.
# Usage: test_signals.sh LLAMATRAIN MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
BIN=$(realpath "$1") MPIEXEC=$2
shift 2
MPI_FLAGS=("$@")
WORK=$(mktemp -d /tmp/lt_signals_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# Each case is one line of the fault suite's results (tests/faults/fault_cases.h, summed by
# summarize.sh): "recovered" when it stopped as documented and resumed, else crash, hang or unclear.
RESULTS=${LLAMATRAIN_FAULT_RESULTS:-}
if [[ -n $RESULTS ]]; then mkdir -p "$RESULTS" && : >"$RESULTS/Faults.signals_under_mpirun.tsv"; fi
record() {
  [[ -n $RESULTS ]] && printf '%s\t%s\t%s\n' "$1" "signal: $2" "$3" >>"$RESULTS/Faults.signals_under_mpirun.tsv"
  return 0
}

"$BIN" prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --test-split 0 --output d.h5 >/dev/null 2>&1 ||
  { echo "prepare failed"; exit 1; }
TRAIN=(train --model-config tiny --vocab-size 300 --data d.h5 --batch-size 2 --global-batch 4 --max-steps 100000 --no-progress)

# Waits until the run in $1 has logged an optimizer step (the signal then lands inside the loop).
wait_for_step() {
  for _ in $(seq 600); do
    grep -q '"type":"step"' "$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
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

# run_case NAME EXPECTED_STATUS HOW [ENV...]: starts training under mpirun -np 2, signals it as
# HOW says once a step is done, and checks the status and the checkpoint.
run_case() {
  local name=$1 expected=$2 how=$3
  shift 3
  mkdir -p "$name"
  if [[ $how == script-term ]]; then
    # A job script as scripts/slurm/*.sbatch writes it: the stop signal reaches the shell, which
    # forwards SIGUSR1 to mpirun and returns mpirun's status.
    cat >"$name/job.sh" <<JOB
#!/usr/bin/env bash
$MPIEXEC ${MPI_FLAGS[*]} -np 2 $BIN ${TRAIN[*]} --checkpoint-dir $name/ckpt --metrics $name/metrics.jsonl &
pid=\$!
trap 'kill -USR1 \$pid' TERM USR1
wait \$pid; rc=\$?
while kill -0 \$pid 2>/dev/null; do wait \$pid; rc=\$?; done
exit \$rc
JOB
    bash "$name/job.sh" >"$name/log" 2>&1 &
  elif [[ $how == plain-term ]]; then
    "$BIN" "${TRAIN[@]}" --checkpoint-dir "$name/ckpt" --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  else
    env "$@" "$MPIEXEC" "${MPI_FLAGS[@]}" -np 2 "$BIN" "${TRAIN[@]}" --checkpoint-dir "$name/ckpt" \
      --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  fi
  local pid=$!
  if ! wait_for_step "$name"; then
    fail "$name: no step within 60 s: $(tail -5 "$name/log")"
    record hang "$name" "no step within 60 s"
    kill -KILL "$pid" 2>/dev/null
    return
  fi
  local ranks
  ranks=$(pgrep -f -- "--checkpoint-dir $name/ckpt" | while read -r p; do
    [[ $(cat /proc/"$p"/comm 2>/dev/null) == llamatrain ]] && echo "$p"; done)
  case $how in
    mpirun-usr1) kill -USR1 "$pid" ;;
    mpirun-term) kill -TERM "$pid" ;;
    one-rank-term) kill -TERM "$(echo "$ranks" | head -1)" ;;
    all-ranks-term) kill -TERM $ranks ;;
    script-term | plain-term) kill -TERM "$pid" ;;
  esac
  wait "$pid"
  local status=$?
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

run_case usr1_to_mpirun 3 mpirun-usr1
run_case term_to_one_rank 3 one-rank-term
run_case term_to_all_ranks 3 all-ranks-term
run_case term_to_job_script 3 script-term
run_case term_to_plain_process 3 plain-term
# Given time before SIGKILL the ranks still checkpoint, but mpirun itself reports 1.
run_case term_to_mpirun 1 mpirun-term OMPI_MCA_odls_base_sigkill_timeout=10

if ((failures)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "all signal cases passed"
