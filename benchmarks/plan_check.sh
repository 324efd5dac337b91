#!/usr/bin/env bash
# Checks `llamatrain plan` against measurements on this machine: one epoch of the epoch sweep's job
# (benchmarks/epoch_sweep.sh: tiny model, builtin:factqa at seq 128, micro-batch 4, global batch 24)
# per configuration, its time next to the plan's prediction from a calibration fitted (by
# `plan --calibrate`) on a separate short run (30 steps, same rank count and ZeRO stage, no
# slowdown) made just before it.
# Configurations: -np 1; -np 2 ZeRO 1 with equal batches; -np 2 with rank 1 made 2x slower
# (--simulate-slowdown 1=2) with equal batches (off), the balanced split from the start (static,
# weights 1,0.5) and auto (the trainer starts equal and rebalances after step 5, so the prediction
# is 5 equal steps + the rest balanced). Runs go one after another, never two at once. The CSV keeps
# medians over the rounds (--repeats) and the range of the per-round ratios.
#
# Usage: benchmarks/plan_check.sh [--repeats N] [--build-dir DIR]
# Environment: REPEATS (1), BUILD_DIR (build), WORK (scratch, default $BUILD_DIR/bench/plan_check),
#   RESULTS (benchmarks/results/plan_check.csv).
# Exit status: 0 done (whatever the ratios), 2 a prerequisite is missing, else the failing run's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
REPEATS="${REPEATS:-1}"
BUILD_DIR="${BUILD_DIR:-build}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeats) REPEATS="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "plan_check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
WORK="${WORK:-$BUILD_DIR/bench/plan_check}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/plan_check.csv}"
LLAMATRAIN="$BUILD_DIR/llamatrain"
[[ -x "$LLAMATRAIN" ]] || { echo "plan_check.sh: $LLAMATRAIN not built" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "plan_check.sh: mpirun not found (scripts/install-deps.sh)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
mkdir -p "$WORK" "$(dirname "$RESULTS")"
HOSTFILE=hostfiles/localhost
JOB=(--model-config tiny --batch-size 4 --global-batch 24 --lr 1e-3 --warmup-steps 10 --seed 1 --no-progress)

data="$WORK/factqa.h5"
if [[ ! -f "$data" ]]; then
  "$LLAMATRAIN" prepare --qa builtin:factqa --prompt-type 3 --vocab-size 512 --seq-len 128 --test-split 0.1 \
      --seed 1 --output "$data" >"$WORK/prepare.log" 2>&1
fi

train() {  # np metrics extra-flags...
  local np="$1" m="$2"; shift 2
  mpirun --oversubscribe --bind-to none -np "$np" "$LLAMATRAIN" train "${JOB[@]}" --data "$data" --metrics "$m" "$@" \
      >"${m%.jsonl}.log" 2>&1 || { echo "plan_check.sh: run failed, see ${m%.jsonl}.log" >&2; exit 1; }
}

# Each round: per configuration, a short calibration run (30 steps, the configuration's rank count
# and ZeRO stage, no slowdown) fitted by `plan --calibrate`, then at once the measured epoch and its
# prediction from that calibration. Fit and measurement sit seconds apart, so the load of a shared
# machine drifts less between them; the ratios are summarised as medians over the rounds.
out="$WORK/runs.csv"
echo "np,zero,balance,slowdown,repeat,measured_epoch_s,predicted_epoch_s,ratio" >"$out"
CONFIGS="1:0:off:- 2:1:off:- 2:1:off:1=2 2:1:static:1=2 2:1:auto:1=2"
for ((rep = 1; rep <= REPEATS; ++rep)); do
  for cfg in $CONFIGS; do
    IFS=: read -r np zero balance slowdown <<<"$cfg"
    tag="np${np}_z${zero}_${balance}_${slowdown//=/x}_r${rep}"
    cal="$WORK/$tag.calibration.json"
    rm -f "$WORK/$tag.cal.jsonl"
    train "$np" "$WORK/$tag.cal.jsonl" --zero "$zero" --max-steps 30
    "$LLAMATRAIN" plan --calibrate "$WORK/$tag.cal.jsonl" --hostfile "$HOSTFILE" --model-config tiny --seq-len 128 \
        --output "$cal" >"${cal%.json}.txt"
    flags=(--zero "$zero" --balance "$balance")
    pflags=()
    if [[ "$slowdown" != "-" ]]; then flags+=(--simulate-slowdown "$slowdown"); pflags+=(--simulate-slowdown "$slowdown"); fi
    [[ "$balance" == static ]] && flags+=(--rank-weights 1,0.5)
    m="$WORK/$tag.jsonl"
    rm -f "$m"
    train "$np" "$m" --epochs 1 "${flags[@]}"
    "$LLAMATRAIN" plan --calibration "$cal" --hostfile "$HOSTFILE" --np "$np" --model-config tiny \
        --data "$data" --global-batch 24 --batch-size 4 --zero "$zero" "${pflags[@]}" --json >"${m%.jsonl}.plan.json"
    python3 - "$m" "${m%.jsonl}.plan.json" "$np" "$zero" "$balance" "$slowdown" "$rep" >>"$out" <<'PY'
import json, sys
m, plan, np_, zero, balance, slowdown, rep = sys.argv[1:]
epoch = [j for j in map(json.loads, open(m)) if j["type"] == "epoch"][0]["epoch_time_s"]
p = json.load(open(plan))
steps = p["steps_per_epoch"]
if balance == "off":
    pred = p["equal"]["epoch_s"]
elif balance == "static":
    pred = p["balanced"]["epoch_s"]
else:  # auto: the first decision comes after step 5 (4 measured steps), then the balanced split
    pred = 5 * p["equal"]["step_s"] + (steps - 5) * p["balanced"]["step_s"]
print(f"{np_},{zero},{balance},{slowdown},{rep},{epoch:.3f},{pred:.3f},{pred / epoch:.3f}")
PY
    echo "np=$np zero=$zero balance=$balance slowdown=$slowdown repeat $rep: $(tail -1 "$out" | cut -d, -f6-8) (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
done

python3 - "$out" "$RESULTS" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
keys = []
for r in rows:
    k = (r["np"], r["zero"], r["balance"], r["slowdown"])
    if k not in keys: keys.append(k)
with open(sys.argv[2], "w") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["np", "zero", "balance", "slowdown", "measured_epoch_s", "predicted_epoch_s", "predicted_over_measured",
                "ratio_min", "ratio_max", "repeats", "within_15pct"])
    for k in keys:
        rs = [r for r in rows if (r["np"], r["zero"], r["balance"], r["slowdown"]) == k]
        meas = statistics.median(float(r["measured_epoch_s"]) for r in rs)
        pred = statistics.median(float(r["predicted_epoch_s"]) for r in rs)
        ratios = [float(r["ratio"]) for r in rs]
        ratio = statistics.median(ratios)
        w.writerow([*k, f"{meas:.3f}", f"{pred:.3f}", f"{ratio:.3f}", f"{min(ratios):.3f}", f"{max(ratios):.3f}", len(rs),
                    "yes" if abs(ratio - 1) <= 0.15 else "NO"])
print(open(sys.argv[2]).read(), end="")
PY
