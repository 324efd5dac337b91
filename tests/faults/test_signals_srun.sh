#!/usr/bin/env bash
# Stop signals as Slurm sends them to ranks started by srun (srun --mpi=pmix -n 2), on a real
# single-node Slurm started for the test (tests/slurm/local_slurm.sh); see docs/usage.md, "Exit
# status". Each case must checkpoint, exit 3 and resume:
#   SIGUSR1 to srun (srun forwards it to every task)
#   scancel --signal=TERM JOB (Slurm signals every task of the job's steps)
#   scancel JOB (SIGTERM to every task, SIGKILL only after KillWait)
#   SIGTERM to one task / to every task
#   scancel --batch --signal=TERM JOB of scripts/slurm/train-cpu.sbatch with LT_LAUNCHER=srun (the
#       batch shell forwards SIGUSR1 to srun)
# Not a case: SIGTERM to srun itself. srun answers it by killing the step's tasks with SIGKILL
# ("Job step aborted"), so nothing can be saved; send SIGUSR1, or use scancel.
# Exit status: 0 passed, 1 failed, 77 skipped (no root, or Slurm or srun's PMIx cannot run here).
# Usage: test_signals_srun.sh LLAMATRAIN SOURCE_DIR
set -uo pipefail
readonly SKIP=77
BIN=$(realpath "$1") SRC=$(realpath "$2")
WORK=$(mktemp -d /tmp/lt_srun_signals_XXXXXX)
LS_DIR=$WORK/slurm
# shellcheck source=../slurm/local_slurm.sh
source "$SRC/tests/slurm/local_slurm.sh"
trap 'local_slurm_stop; rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

if [[ $(id -u) -ne 0 ]]; then echo "SKIPPED: needs root to run slurmctld/slurmd as SlurmUser=root"; exit $SKIP; fi
if ! local_slurm_start; then echo "SKIPPED: Slurm cannot start on this machine: $LS_WHY"; exit $SKIP; fi
if ! srun --mpi=list 2>&1 | grep -qw pmix; then echo "SKIPPED: this Slurm's srun has no PMIx plugin"; exit $SKIP; fi

RESULTS_FILE=${LLAMATRAIN_FAULT_RESULTS:+$LLAMATRAIN_FAULT_RESULTS/Faults.signals_under_srun.tsv}
# shellcheck source=signals_lib.sh
source "$SRC/tests/faults/signals_lib.sh"

"$BIN" prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --test-split 0 --output d.h5 >/dev/null 2>&1 ||
  { echo "prepare failed"; exit 1; }
TRAIN=(train --model-config tiny --vocab-size 300 --data d.h5 --batch-size 2 --global-batch 4 --max-steps 100000 --no-progress)
# The same run as a config file, for the batch script.
cat >run.toml <<TOML
[train]
model-config = "tiny"
vocab-size = 300
data = "$WORK/d.h5"
batch-size = 2
global-batch = 4
max-steps = 100000
no-progress = true
TOML

launch() {
  local name=$1 how=$2
  if [[ $how == batch-term ]]; then
    # sbatch --wait returns the job's exit status; LT_MAX_REQUEUES=0: exit 3 instead of requeuing.
    sbatch --wait --job-name="lt-$name" --ntasks=2 --time=5 --output="$WORK/$name/log" \
      --export="ALL,LT_BIN=$BIN,LT_LAUNCHER=srun,LT_SRUN_MPI=pmix,LT_MAX_REQUEUES=0,LT_CONFIG=$WORK/run.toml,LT_CHECKPOINT_DIR=$WORK/$name/ckpt,LT_ARGS=--metrics $WORK/$name/metrics.jsonl" \
      "$SRC/scripts/slurm/train-cpu.sbatch" >/dev/null 2>&1 &
  else
    srun --mpi=pmix -n 2 --oversubscribe --job-name="lt-$name" "$BIN" "${TRAIN[@]}" \
      --checkpoint-dir "$name/ckpt" --metrics "$name/metrics.jsonl" >"$name/log" 2>&1 &
  fi
  LAUNCH_PID=$!
}

deliver() {
  local how=$1 pid=$2 ranks=$3 name=$4 job
  job=$(squeue -h -o %i -n "lt-$name")
  case $how in
    srun-usr1) kill -USR1 "$pid" ;;
    scancel-term) scancel --signal=TERM "$job" ;;
    scancel) scancel "$job" ;;
    one-rank-term) kill -TERM "$(echo "$ranks" | head -1)" ;;
    all-ranks-term) kill -TERM $ranks ;;
    batch-term) scancel --batch --signal=TERM "$job" ;;
  esac
}

for c in "usr1_to_srun srun-usr1" "scancel_signal_term scancel-term" "scancel scancel" \
  "term_to_one_task one-rank-term" "term_to_all_tasks all-ranks-term" "term_to_batch_script batch-term"; do
  read -r name how <<<"$c"
  run_case "$name" 3 "$how"
done
signal_cases_end
