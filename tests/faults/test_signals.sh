#!/usr/bin/env bash
# Stop signals as schedulers send them, under mpirun -np 2 (see docs/usage.md, "Exit status"):
#   SIGUSR1 to mpirun (Open MPI forwards it)        -> checkpoint, mpirun exits 3
#   SIGTERM to one rank / to every rank             -> checkpoint, mpirun exits 3
#   SIGTERM to a job script that forwards SIGUSR1   -> checkpoint, the script exits 3
#   SIGTERM or SIGINT to a plain process (no mpirun) -> checkpoint, exit 3
#   SIGINT to mpirun's process group (Ctrl-C at a terminal; the ranks have process groups of their
#       own, so only mpirun gets it)               -> Open MPI kills the job: SIGTERM to the ranks
#       after odls_base_sigkill_timeout (1 s): this small model checkpoints in time; mpirun exits 1
#   SIGINT to a job script's process group, the script trapping INT and sending SIGUSR1 to an
#       mpirun started with setsid (docs/usage.md)  -> checkpoint, the script exits 3
#   SIGINT to a plain process without --checkpoint-dir, with --output -> checkpoint in
#       OUTPUT/checkpoints, exit 3; the same command again resumes, completes and removes it
#   a second SIGINT while the stop checkpoint is written -> the process ends at once (130)
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
RESULTS_FILE=${LLAMATRAIN_FAULT_RESULTS:+$LLAMATRAIN_FAULT_RESULTS/Faults.signals_under_mpirun.tsv}
# shellcheck source=signals_lib.sh
source "$(dirname "$(readlink -f "$0")")/signals_lib.sh"

"$BIN" prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --test-split 0 --output d.h5 >/dev/null 2>&1 ||
  { echo "prepare failed"; exit 1; }
TRAIN=(train --model-config tiny --vocab-size 300 --data d.h5 --batch-size 2 --global-batch 4 --max-steps 100000 --no-progress)

launch() {
  local name=$1 how=$2 env=()
  [[ $how == mpirun-term ]] && env=(OMPI_MCA_odls_base_sigkill_timeout=10)
  if [[ $how == script-group-int ]]; then
    # Ctrl-C at a terminal reaches the whole foreground process group: the script and, unless it
    # has its own session, mpirun (which would abort the job). SIGINT at its default action, as in
    # a terminal (a background job of a non-interactive shell would ignore it).
    cat >"$name/job.sh" <<JOB
#!/usr/bin/env bash
setsid $MPIEXEC ${MPI_FLAGS[*]} -np 2 $BIN ${TRAIN[*]} --checkpoint-dir $name/ckpt --metrics $name/metrics.jsonl &
pid=\$!
trap 'kill -USR1 \$pid' INT TERM USR1
wait \$pid; rc=\$?
while kill -0 \$pid 2>/dev/null; do wait \$pid; rc=\$?; done
exit \$rc
JOB
    setsid env --default-signal=INT bash "$name/job.sh" >"$name/log" 2>&1 &
  elif [[ $how == mpirun-group-int ]]; then
    setsid env --default-signal=INT "$MPIEXEC" "${MPI_FLAGS[@]}" -np 2 "$BIN" "${TRAIN[@]}" --checkpoint-dir "$name/ckpt" \
      --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  elif [[ $how == script-term ]]; then
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
  elif [[ $how == plain-term || $how == plain-int ]]; then
    "$BIN" "${TRAIN[@]}" --checkpoint-dir "$name/ckpt" --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  else
    env "${env[@]}" "$MPIEXEC" "${MPI_FLAGS[@]}" -np 2 "$BIN" "${TRAIN[@]}" --checkpoint-dir "$name/ckpt" \
      --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  fi
  LAUNCH_PID=$!
}

deliver() {
  local how=$1 pid=$2 ranks=$3
  case $how in
    mpirun-usr1) kill -USR1 "$pid" ;;
    mpirun-term) kill -TERM "$pid" ;;
    one-rank-term) kill -TERM "$(echo "$ranks" | head -1)" ;;
    all-ranks-term) kill -TERM $ranks ;;
    script-term | plain-term) kill -TERM "$pid" ;;
    plain-int) kill -INT "$pid" ;;
    mpirun-group-int | script-group-int) kill -INT -- -"$pid" ;;
  esac
}

run_case usr1_to_mpirun 3 mpirun-usr1
run_case term_to_one_rank 3 one-rank-term
run_case term_to_all_ranks 3 all-ranks-term
run_case term_to_job_script 3 script-term
run_case term_to_plain_process 3 plain-term
# Given time before SIGKILL the ranks still checkpoint, but mpirun itself reports 1.
run_case term_to_mpirun 1 mpirun-term
run_case int_to_plain_process 3 plain-int
run_case int_to_mpirun_group 1 mpirun-group-int
run_case int_to_job_script_group 3 script-group-int

# Without --checkpoint-dir: a stop checkpoint in --output's checkpoints/, then the same command
# resumes from it, completes and removes it.
default_dir_case() {
  local name=int_without_checkpoint_dir out=int_without_checkpoint_dir/out status
  mkdir -p "$name"
  "$BIN" "${TRAIN[@]/100000/2000}" --output "$out" --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  local pid=$!
  wait_for_step "$name" || fail "$name: no step within 60 s"
  kill -INT "$pid"
  wait "$pid"
  status=$?
  local before=$failures
  [[ $status == 3 ]] || fail "$name: exit status $status, expected 3: $(tail -3 "$name/log")"
  [[ -f $out/checkpoints/latest ]] || fail "$name: no checkpoint in $out/checkpoints: $(ls -R "$out" | head)"
  grep -q "run the same command again" "$name/log" || fail "$name: the stop line does not say how to continue"
  "$BIN" "${TRAIN[@]/100000/2000}" --output "$out" >"$name/rerun.log" 2>&1 || fail "$name: the rerun failed"
  grep -q "resumed from $out/checkpoints" "$name/rerun.log" || fail "$name: the rerun did not resume: $(head -3 "$name/rerun.log")"
  [[ -f $out/model.h5 && ! -e $out/checkpoints ]] || fail "$name: after the rerun: $(ls "$out")"
  if ((failures == before)); then
    echo "ok: $name: exit status 3, resumed from $out/checkpoints, which the completed run removed"
    record recovered "$name" "status 3, checkpoint in --output, resumed and removed"
  else
    record unclear "$name" "status $status"
  fi
}
default_dir_case

# A second Ctrl-C while the stop checkpoint is being written (held open 5 s) ends the process at once.
second_int_case() {
  local name=second_int status
  mkdir -p "$name"
  LLAMATRAIN_TEST_CHECKPOINT_DELAY_MS=5000 "$BIN" "${TRAIN[@]}" --checkpoint-dir "$name/ckpt" \
    --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  local pid=$!
  wait_for_step "$name" || fail "$name: no step within 60 s"
  kill -INT "$pid"
  sleep 0.5
  local t0=$SECONDS
  kill -INT "$pid"
  wait "$pid"
  status=$?
  if [[ $status == 130 ]] && ((SECONDS - t0 <= 2)); then
    echo "ok: $name: exit status 130 at once"
    record clear "$name" "status 130 at once"
  else
    fail "$name: exit status $status after $((SECONDS - t0)) s, expected 130 at once"
    record unclear "$name" "status $status"
  fi
}
second_int_case

signal_cases_end
