#!/usr/bin/env bash
# Epoch time across cluster configurations (the reference deployment's chart of epoch time per
# configuration, on one machine): one epoch of a fixed small job for a list of rank counts, ZeRO
# stages and balance modes, with and without a SIMULATED slow rank (--simulate-slowdown: that
# rank sleeps (FACTOR-1) x its compute time after every micro-batch, standing in for an older GPU).
#
# Job: the embedded default data (builtin:factqa, prompt layout 3, vocab 512, seq 128; 1800
# training rows), the `tiny` model, micro-batch 4, global batch 24 (6 micro-batches per step,
# 77 steps per epoch), seed 1. Each configuration runs REPEATS times; the CSV keeps the median
# epoch time (training steps only, the test-split evaluation excluded).
#
# Usage: benchmarks/epoch_sweep.sh [--repeats N] [--build-dir DIR] [--configs "np:zero:balance:slowdown ..."]
# Environment (options win): REPEATS (5), BUILD_DIR (build), WORK (scratch, default
#   $BUILD_DIR/bench/epoch_sweep), RESULTS (benchmarks/results/epoch_sweep: .csv and .png),
#   PYTHON (/usr/bin/python3 with matplotlib, for the chart; the CSV needs only python3).
# A configuration is np:zero:balance:slowdown, slowdown "-" or RANK=FACTOR; balance static uses
# weights that match the slowdown (the slow rank gets 1/FACTOR of a fast rank's share).
# Exit status: 0 done, 2 a prerequisite is missing, else the failing run's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
REPEATS="${REPEATS:-5}"
BUILD_DIR="${BUILD_DIR:-build}"
CONFIGS="${CONFIGS:-1:0:off:- 2:0:off:- 2:1:off:- 2:2:off:- 3:1:off:- 2:1:off:1=2 2:1:static:1=2 2:1:auto:1=2 2:2:auto:1=2}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeats) REPEATS="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --configs) CONFIGS="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "epoch_sweep.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
WORK="${WORK:-$BUILD_DIR/bench/epoch_sweep}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/epoch_sweep}"
PYTHON="${PYTHON:-/usr/bin/python3}"
LLAMATRAIN="$BUILD_DIR/llamatrain"
[[ -x "$LLAMATRAIN" ]] || { echo "epoch_sweep.sh: $LLAMATRAIN not built (run scripts/build.sh)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "epoch_sweep.sh: mpirun not found (scripts/install-deps.sh)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Threads per rank: llamatrain's default (cores / ranks on the node), not an inherited setting.
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
mkdir -p "$WORK" "$(dirname "$RESULTS")"

data="$WORK/factqa.h5"
if [[ ! -f "$data" ]]; then
  "$LLAMATRAIN" prepare --qa builtin:factqa --prompt-type 3 --vocab-size 512 --seq-len 128 --test-split 0.1 \
      --seed 1 --output "$data" >"$WORK/prepare.log" 2>&1
fi

runs="$WORK/runs.csv"
echo "np,zero,balance,slowdown,repeat,epoch_time_s,tokens_per_s,final_split" >"$runs"
# Repeats go round the whole list (config 1..n, then again), so that slow spells of a shared
# machine fall on every configuration alike rather than on one.
for ((rep = 1; rep <= REPEATS; ++rep)); do
  for cfg in $CONFIGS; do
    IFS=: read -r np zero balance slowdown <<<"$cfg"
    flags=(--zero "$zero" --balance "$balance")
    if [[ "$slowdown" != "-" ]]; then
      flags+=(--simulate-slowdown "$slowdown")
      slow_rank="${slowdown%%=*}" factor="${slowdown#*=}"
    else
      slow_rank=-1 factor=1
    fi
    if [[ "$balance" == static ]]; then
      weights=$(awk -v n="$np" -v s="$slow_rank" -v f="$factor" \
        'BEGIN { for (r = 0; r < n; ++r) printf "%s%g", (r ? "," : ""), (r == s ? 1 / f : 1) }')
      flags+=(--rank-weights "$weights")
    fi
    m="$WORK/np${np}_z${zero}_${balance}_${slowdown//=/x}_r${rep}.jsonl"
    mpirun --oversubscribe --bind-to none -np "$np" "$LLAMATRAIN" train --model-config tiny --data "$data" --batch-size 4 \
        --global-batch 24 --epochs 1 --lr 1e-3 --warmup-steps 10 --seed 1 --no-progress --metrics "$m" \
        "${flags[@]}" >"${m%.jsonl}.log" 2>&1 || { echo "epoch_sweep.sh: run failed, see ${m%.jsonl}.log" >&2; exit 1; }
    python3 - "$m" "$np" "$zero" "$balance" "$slowdown" "$rep" >>"$runs" <<'PY'
import json, sys
m, np_, zero, balance, slowdown, rep = sys.argv[1:]
epoch = [j for j in map(json.loads, open(m)) if j["type"] == "epoch"][0]
split = ";".join(str(k) for k in epoch.get("split", []))
print(f"{np_},{zero},{balance},{slowdown},{rep},{epoch['epoch_time_s']:.3f},{epoch['tokens_per_s']:.0f},{split}")
PY
    echo "np=$np zero=$zero balance=$balance slowdown=$slowdown repeat $rep: $(tail -1 "$runs" | cut -d, -f6) s" >&2
  done
done

# Median per configuration, the ratio against the same configuration with --balance off, and the chart.
python3 - "$runs" "$RESULTS.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
keys = []
for r in rows:
    k = (r["np"], r["zero"], r["balance"], r["slowdown"])
    if k not in keys: keys.append(k)
med = {}
out = []
for k in keys:
    rs = [r for r in rows if (r["np"], r["zero"], r["balance"], r["slowdown"]) == k]
    t = statistics.median(float(r["epoch_time_s"]) for r in rs)
    tps = statistics.median(float(r["tokens_per_s"]) for r in rs)
    med[k] = t
    out.append([*k, f"{t:.3f}", f"{tps:.0f}", rs[-1]["final_split"], len(rs)])
with open(sys.argv[2], "w") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["np", "zero", "balance", "slowdown", "epoch_time_s", "tokens_per_s", "final_split", "repeats",
                "vs_balance_off"])
    for o in out:
        off = med.get((o[0], o[1], "off", o[3]))
        w.writerow(o + [f"{float(o[4]) / off:.3f}" if off else ""])
print(open(sys.argv[2]).read(), end="")
PY
if "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  "$PYTHON" "$REPO/benchmarks/epoch_sweep_plot.py" "$RESULTS.csv" "$RESULTS.png"
else
  echo "epoch_sweep.sh: $PYTHON has no matplotlib; wrote the CSV only (scripts/install-deps.sh --bench)" >&2
fi
