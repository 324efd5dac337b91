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
RESULTS_FILE=${LLAMATRAIN_FAULT_RESULTS:+$LLAMATRAIN_FAULT_RESULTS/Faults.signals_under_mpirun.tsv}
# shellcheck source=signals_lib.sh
source "$(dirname "$(readlink -f "$0")")/signals_lib.sh"

"$BIN" prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --test-split 0 --output d.h5 >/dev/null 2>&1 ||
  { echo "prepare failed"; exit 1; }
TRAIN=(train --model-config tiny --vocab-size 300 --data d.h5 --batch-size 2 --global-batch 4 --max-steps 100000 --no-progress)

launch() {
  local name=$1 how=$2 env=()
  [[ $how == mpirun-term ]] && env=(OMPI_MCA_odls_base_sigkill_timeout=10)
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
  esac
}

run_case usr1_to_mpirun 3 mpirun-usr1
run_case term_to_one_rank 3 one-rank-term
run_case term_to_all_ranks 3 all-ranks-term
run_case term_to_job_script 3 script-term
run_case term_to_plain_process 3 plain-term
# Given time before SIGKILL the ranks still checkpoint, but mpirun itself reports 1.
run_case term_to_mpirun 1 mpirun-term

signal_cases_end
