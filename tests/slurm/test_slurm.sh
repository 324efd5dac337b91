#!/usr/bin/env bash
# scripts/slurm/train-cpu.sbatch on a real single-node Slurm started for this test.
#   test_slurm.sh LLAMATRAIN SOURCE_DIR
# 1. Job A runs the batch script uninterrupted: it must complete, with metrics for steps 1..N
#    exactly once each and checkpoints at every --checkpoint-every steps, `latest` at step N.
# 2. Job B runs the same training and is pre-empted with `scancel --batch --signal=TERM` after a
#    few steps: the batch shell forwards SIGUSR1 to mpirun, the ranks checkpoint step K and exit 3,
#    the script requeues the job, and the second run resumes from step K. Its metrics must hold
#    steps 1..N exactly once each in order (no gap; no step repeated, because the stop checkpoint
#    is the last step the first run logged), the resume must name step K, and every step's loss
#    must equal job A's (the same rank count continues bit-identically; held to 1e-6 relative).
# 3. Job C is given --time=2 --signal=B:USR1@110 and too many steps: Slurm's warning signal must
#    make it checkpoint, requeue and resume at the next step.
# Exit status: 0 passed, 1 failed, 77 skipped (Slurm cannot start here; the reason is printed).
set -uo pipefail

readonly SKIP=77
bin=$(readlink -f "${1:?usage: test_slurm.sh LLAMATRAIN SOURCE_DIR}")
src=$(readlink -f "${2:?usage: test_slurm.sh LLAMATRAIN SOURCE_DIR}")
script=$src/scripts/slurm/train-cpu.sbatch
readonly N=200 EVERY=50

LS_DIR=$(mktemp -d /tmp/lt_slurm_XXXXXX)
# shellcheck source=local_slurm.sh
source "$(dirname "$(readlink -f "$0")")/local_slurm.sh"
finish() {
  local rc=$?
  kill "$watchdog" 2>/dev/null
  local_slurm_stop
  if [[ $rc -eq 0 || $rc -eq $SKIP || -n ${LT_SLURM_TEST_CLEAN:-} ]]; then
    rm -rf "$LS_DIR"
  else
    echo "test_slurm: kept $LS_DIR for inspection (logs in log/, jobs in job/)" >&2
  fi
  exit "$rc"
}
# The daemons outlive a test killed by CTest's timeout, so stop well before it (TIMEOUT 600): the
# watchdog's SIGTERM makes this script exit through finish().
( for ((i = 0; i < 480; i++)); do sleep 1; done; echo "test_slurm: FAILED: still running after 480 s" >&2; kill -TERM $$ ) &
watchdog=$!
trap finish EXIT
trap 'exit 1' INT TERM

fails=0
check() {  # check "what" <test command...>
  local what=$1
  shift
  if "$@"; then
    echo "  ok: $what"
  else
    echo "  FAILED: $what"
    fails=$((fails + 1))
  fi
}
die() {
  echo "test_slurm: FAILED: $*" >&2
  exit 1
}

if [[ $(id -u) -ne 0 ]]; then
  echo "test_slurm: SKIPPED: needs root to run slurmctld/slurmd as SlurmUser=root"
  exit $SKIP
fi
command -v mpirun >/dev/null || { echo "test_slurm: SKIPPED: mpirun not found"; exit $SKIP; }
if ! local_slurm_start; then
  echo "test_slurm: SKIPPED: Slurm cannot start on this machine: $LS_WHY"
  exit $SKIP
fi

# ---- the job: a tiny model on the built-in data, described by a run.toml next to it ------------
job=$LS_DIR/job
mkdir -p "$job"
"$bin" prepare --qa builtin:factqa --prompt-type 3 --vocab-size 512 --seq-len 64 --test-split 0.1 --seed 1 \
  --output "$job/data.h5" >"$job/prepare.log" 2>&1 || die "prepare failed: $(tail -n 5 "$job/prepare.log")"
cat >"$job/run.toml" <<EOF
[train]
model-config = "tiny"
data = "data.h5"
batch-size = 4
global-batch = 8
max-steps = $N
lr = 3e-3
warmup-steps = 10
seed = 7
checkpoint-every = $EVERY
keep-last = 0
no-progress = true
EOF

# Submits the batch script as job NAME with 2 ranks; prints the job id.
#   submit NAME "MORE TRAIN OPTIONS" [SBATCH OPTIONS...]   (these override the script's #SBATCH lines)
submit() {
  local name=$1 more=$2
  shift 2
  sbatch --parsable --job-name="$name" --ntasks=2 --time=10 --output="$job/$name.out" \
    --export="ALL,OMPI_ALLOW_RUN_AS_ROOT=1,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,OMPI_MCA_rmaps_base_oversubscribe=1,LT_BIN=${job_bin:-$bin},LT_CONFIG=$job/run.toml,LT_CHECKPOINT_DIR=$job/ckpt-$name,LT_ARGS=--metrics $job/$name.jsonl --output $job/out-$name $more" \
    "$@" "$script"
}
# Waits until job ID has been requeued (pending, Restarts=1) and makes it eligible now: Slurm
# holds a requeued job for ~120 s (EligibleTime; Reason=BeginTime), which the test does not sit out.
# At most 150 s: job C's warning signal waits for slurmctld's timer, which a cold CI run on this
# 2-core machine once saw pass 66 s without it (2026-12-05); its 2-minute limit bounds the wait.
release_requeued() {
  local id=$1 t
  for ((t = 0; t < 600; t++)); do
    [[ $(job_field "$id" JobState) == PENDING && $(job_field "$id" Restarts) == 1 ]] && break
    sleep 0.25
  done
  [[ $(job_field "$id" JobState) == PENDING ]] ||
    die "job $id was not requeued (state $(job_field "$id" JobState)): $(tail -n 20 "$job"/*.out)"
  # Not at once: slurmd revoked the first run's job credential at the requeue, with a time stamp in
  # seconds, and refuses a launch in that same second ("Job credential revoked").
  sleep 2
  echo "  job $id requeued (eligible at $(job_field "$id" EligibleTime)); scontrol update StartTime=now"
  scontrol update JobId="$id" StartTime=now || die "scontrol update StartTime=now failed"
}
job_field() {  # job_field ID Field -> the value in `scontrol show job`
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}
# Waits until job ID is finished for good (not pending, running, requeued or completing).
wait_done() {
  local id=$1 limit=$2 t state
  for ((t = 0; t < limit * 4; t++)); do
    state=$(job_field "$id" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) return 0 ;;
    esac
    sleep 0.25
  done
  die "job $id still ${state:-unknown} (reason $(job_field "$id" Reason)) after $limit s; log: $(tail -n 20 "$job"/*.out 2>&1)"
}
# The "step" records of a metrics file, one line each: "<step> <loss>", in file order.
steps_of() { grep '"type":"step"' "$1" | sed -E 's/.*"loss":([^,}]*).*"step":([0-9]+).*/\2 \1/'; }
checkpoints_of() { grep '"type":"checkpoint"' "$1" | sed -E 's/.*"step":([0-9]+).*/\1/' | tr '\n' ' '; }
# Per run of the trainer (each start writes a "memory" record; a resumed run appends to the file):
# "<run> <first step> <last step> <step records>", one line per run.
runs_of() {
  awk '/"type":"memory"/ {r++; first[r] = 0; last[r] = 0; n[r] = 0}
       /"type":"step"/ {match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
                        if (!n[r]) first[r] = s; last[r] = s; n[r]++}
       END {for (i = 1; i <= r; i++) print i, first[i], last[i], n[i]}' "$1"
}
# Whether the first column is exactly 1..n in order.
is_one_to_n() { awk -v n="$2" '$1 != NR {exit 1} END {exit NR != n}' "$1"; }

t0=$SECONDS
# ---- job A: uninterrupted ------------------------------------------------------------------------
echo "== job A: $N steps, checkpoint every $EVERY, not interrupted"
a=$(submit A "") || die "sbatch failed"
wait_done "$a" 120
steps_of "$job/A.jsonl" >"$job/A.steps"
echo "  job $a: $(job_field "$a" JobState), exit $(job_field "$a" ExitCode), restarts $(job_field "$a" Restarts), $(wc -l <"$job/A.steps") step records, checkpoints at [$(checkpoints_of "$job/A.jsonl")], $((SECONDS - t0)) s"
check "job A completed with exit code 0:0" [ "$(job_field "$a" JobState) $(job_field "$a" ExitCode)" = "COMPLETED 0:0" ]
check "job A was not restarted" [ "$(job_field "$a" Restarts)" = 0 ]
check "job A logged steps 1..$N exactly once each, in order" is_one_to_n "$job/A.steps" "$N"
check "job A checkpointed at steps 50 100 150 200" [ "$(checkpoints_of "$job/A.jsonl")" = "50 100 150 200 " ]
check "job A's latest checkpoint is step $N" [ "$(cat "$job/ckpt-A/latest" 2>/dev/null)" = "$(printf 'step-%08d' $N)" ]
check "job A wrote its rank files" [ -f "$job/ckpt-A/$(printf 'step-%08d' $N)/rank-00001.h5" ]
check "job A wrote the final model" [ -f "$job/out-A/model.h5" ]
check "job A ran 2 ranks under Slurm" grep -q "starting on .*(2 ranks, restart 0)" "$job/A.out"

# ---- job B: pre-empted with scancel --batch --signal=TERM, requeued, resumed ---------------------
echo "== job B: the same run, pre-empted after some steps"
t1=$SECONDS
b=$(submit B "") || die "sbatch failed"
for ((t = 0; t < 400; t++)); do
  n=$(grep -c '"type":"step"' "$job/B.jsonl" 2>/dev/null)
  ((${n:-0} >= 20)) && break
  sleep 0.25
done
((${n:-0} >= 20 && n < N)) || die "job B did not reach 20 steps in 100 s (at ${n:-0}): $(tail -n 20 "$job/B.out")"
scancel --batch --signal=TERM "$b" || die "scancel failed"
echo "  scancel --batch --signal=TERM $b at step ~$n"
release_requeued "$b"
wait_done "$b" 150
steps_of "$job/B.jsonl" >"$job/B.steps"
k=$(sed -nE 's/.*stop signal: checkpoint of step ([0-9]+) written.*/\1/p' "$job/B.out" | head -n 1)
echo "  job $b: $(job_field "$b" JobState), exit $(job_field "$b" ExitCode), restarts $(job_field "$b" Restarts), $(wc -l <"$job/B.steps") step records, checkpoints at [$(checkpoints_of "$job/B.jsonl")], stop checkpoint at step ${k:-none}, $((SECONDS - t1)) s"
check "job B's batch shell got SIGTERM and forwarded SIGUSR1" grep -q "got SIGTERM: asking llamatrain to checkpoint" "$job/B.out"
stop_step_ok() { [[ $k =~ ^[0-9]+$ ]] && ((k >= n && k < N)); }
check "job B's ranks wrote a stop checkpoint after step $n, before $N" stop_step_ok
check "the first run exited with status 3 and requeued" grep -q "llamatrain ended with status 3" "$job/B.out"
check "the job requeued itself" grep -q "requeuing job $b" "$job/B.out"
check "job B completed with exit code 0:0" [ "$(job_field "$b" JobState) $(job_field "$b" ExitCode)" = "COMPLETED 0:0" ]
check "job B restarted exactly once" [ "$(job_field "$b" Restarts)" = 1 ]
check "the second run started as restart 1" grep -q "(2 ranks, restart 1)" "$job/B.out"
check "the second run resumed from the stop checkpoint at step ${k:-?}" \
  grep -qE "resumed from .*$(printf 'step-%08d' "${k:-0}") at step ${k:-x} " "$job/B.out"
check "checkpoint ${k:-?} is in job B's metrics" grep -q "\"step\":${k:-x},\"type\":\"checkpoint\"" "$job/B.jsonl"
check "job B logged steps 1..$N exactly once each, in order, across the requeue" is_one_to_n "$job/B.steps" "$N"
echo "  runs in job B's metrics (run, first step, last step, step records): $(runs_of "$job/B.jsonl" | tr '\n' ';')"
check "job B's metrics hold two runs: steps 1..${k:-?}, then ${k:-?}+1..$N" \
  [ "$(runs_of "$job/B.jsonl" | tr '\n' ';')" = "1 1 ${k:-x} ${k:-x};2 $((${k:-0} + 1)) $N $((N - ${k:-0}));" ]
check "job B's latest checkpoint is step $N" [ "$(cat "$job/ckpt-B/latest" 2>/dev/null)" = "$(printf 'step-%08d' $N)" ]
check "job B wrote the final model" [ -f "$job/out-B/model.h5" ]
# Every step's loss, before and after the requeue, equals the uninterrupted run's.
worst=$(paste "$job/A.steps" "$job/B.steps" | awk '
  $1 != $3 {print "step-mismatch"; exit}
  {d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > w) w = r}
  END {if (NR == 0) print "none"; else printf "%.3g\n", w}')
echo "  largest relative loss difference B vs A over $N steps: $worst (final loss A $(tail -n 1 "$job/A.steps" | cut -d' ' -f2), B $(tail -n 1 "$job/B.steps" | cut -d' ' -f2))"
check "job B's losses equal job A's at every step (relative difference <= 1e-6)" \
  awk -v w="$worst" 'BEGIN {exit !(w ~ /^[0-9.e+-]+$/ && w + 0 <= 1e-6)}'

# ---- job C: the time limit. --time=2 --signal=B:USR1@110: Slurm sends SIGUSR1 to the batch shell
# 10 s into the run (its timer checks run every ~30 s, so up to ~40 s, later on a loaded machine), long before 200 steps
# would end; the job must checkpoint, requeue and resume. Cancelled once the resume is seen. The
# 2-minute limit leaves 80 s for a late timer: with --time=1 --signal=B:USR1@50 (the same 10 s) a
# cold CI run on a loaded machine once saw the limit's SIGTERM at 59 s and no warning signal.
echo "== job C: --time=2 --signal=B:USR1@110, a run too long for it"
t2=$SECONDS
# Its first run only waits for the signal, training all the while: its ranks run at nice 19
# (LT_BIN is this wrapper), so the wait takes the CPU the suite's other tests leave, not two cores.
printf '#!/bin/sh\nif [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then exec nice -n 19 "%s" "$@"; fi\nexec "%s" "$@"\n' \
  "$bin" "$bin" >"$job/llamatrain-first-run-nice"
chmod +x "$job/llamatrain-first-run-nice"
# Job C under the name $1: until its second run has logged steps; sets c (its ID) and kc (its stop
# checkpoint's step, empty without one).
run_job_c() {
  local name=$1 t
  c=$(job_bin=$job/llamatrain-first-run-nice submit "$name" "--max-steps 100000" --time=2 --signal=B:USR1@110) ||
    die "sbatch failed"
  release_requeued "$c"
  for ((t = 0; t < 240; t++)); do
    [[ $(runs_of "$job/$name.jsonl" | sed -n 2p | cut -d' ' -f4) -ge 2 ]] 2>/dev/null && break
    sleep 0.25
  done
  scancel "$c"
  kc=$(sed -nE 's/.*stop signal: checkpoint of step ([0-9]+) written.*/\1/p' "$job/$name.out" | head -n 1)
  echo "  job $c: stop checkpoint at step ${kc:-none}; runs (run, first step, last step, step records): $(runs_of "$job/$name.jsonl" | tr '\n' ';') $((SECONDS - t2)) s"
}
run_job_c C
# Slurm itself may send no warning signal at all: on a loaded machine slurmctld once let job C reach
# its time limit (SIGTERM at 2 min, nothing logged before it; 2026-12-05). That is Slurm's timer, not
# what this test checks, so job C then runs once more as C2, held to every check below.
if ! grep -q "got SIGUSR1" "$job/C.out" && grep -q "DUE TO TIME LIMIT" "$job/C.out"; then
  echo "  Slurm sent job $c no warning signal before its time limit; job C once more, as C2"
  t2=$SECONDS
  run_job_c C2
  mv "$job/C.out" "$job/C-no-signal.out" && cp "$job/C2.out" "$job/C.out" && cp "$job/C2.jsonl" "$job/C.jsonl"
fi
check "job C's batch shell got SIGUSR1 from Slurm before the time limit" grep -q "got SIGUSR1: asking llamatrain to checkpoint" "$job/C.out"
check "job C's first run wrote a stop checkpoint, exited with status 3 and requeued" \
  bash -c '[[ $1 =~ ^[0-9]+$ ]] && grep -q "llamatrain ended with status 3" "$2" && grep -q "requeuing job $3" "$2"' _ "$kc" "$job/C.out" "$c"
check "job C's second run resumed from step ${kc:-?}" grep -qE "resumed from .*$(printf 'step-%08d' "${kc:-0}") at step ${kc:-x} " "$job/C.out"
c_runs_ok() {
  local r1 r2
  r1=$(runs_of "$job/C.jsonl" | sed -n 1p)
  r2=$(runs_of "$job/C.jsonl" | sed -n 2p | cut -d' ' -f1-2)
  [[ $r1 == "1 1 $kc $kc" && $r2 == "2 $((kc + 1))" ]]
}
check "job C's metrics: run 1 logged steps 1..${kc:-?}, run 2 starts at step ${kc:-?}+1" c_runs_ok

echo "== $((SECONDS - t0)) s for the three jobs; $fails check(s) failed"
((fails == 0)) || exit 1
exit 0
