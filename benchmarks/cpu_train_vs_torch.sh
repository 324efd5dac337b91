#!/usr/bin/env bash
# CPU training throughput: llamatrain (--precision fp32 and bf16) vs PyTorch eager fp32 and
# PyTorch bf16 autocast on the same model, threads, batch, optimizer and data (DESIGN.md "Numbers
# we hold ourselves to"; issue 19's targets: bf16 >= 3x PyTorch eager fp32, >= 2x bf16 autocast).
#
# Models: the stories15m preset (dim 288, hidden 768, 6 layers, 6 heads, vocab 32000, tied
# classifier) and stories110m (dim 768, hidden 2048, 12 layers, 12 heads), seq 256, batch 8, AdamW
# lr 3e-4 (constant), betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices, grad clip 1.0.
# Data: ../shared/data/tinystories_sample.txt tokenised with the real Llama 2 tokenizer. Timing:
# median step time after 3 warm-up steps. Each figure is printed next to the GEMM rate that bounds
# it (llamatrain: its start-of-run probe in that precision and the rate its products reached;
# PyTorch: torch.matmul at the model's FFN shape) and llamatrain's step-time breakdown.
#
# Usage: benchmarks/cpu_train_vs_torch.sh [--threads N] [--steps N] [--build-dir DIR]
# Environment (options win): THREADS (default: nproc), STEPS (20; stories110m: STEPS_110M, 8),
#   PRESETS ("stories15m stories110m"), PRECISIONS ("fp32 bf16": which precisions of both
#   programs run; "bf16" alone times only the bf16 targets' pair), BUILD_DIR (build),
#   WORK (scratch folder, default $BUILD_DIR/bench/cpu_train_vs_torch), DATA_DIR
#   (../shared/data beside the checkout), PYTHON (/usr/bin/python3: needs torch, numpy, h5py),
#   RESULTS (benchmarks/results/cpu_train_vs_torch.json).
# Exit status: 0 done, 2 a prerequisite is missing (message says which), else the failing step's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

THREADS="${THREADS:-$(nproc)}"
STEPS="${STEPS:-20}"
BUILD_DIR="${BUILD_DIR:-build}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_train_vs_torch.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
WORK="${WORK:-$BUILD_DIR/bench/cpu_train_vs_torch}"
DATA_DIR="${DATA_DIR:-$REPO/../shared/data}"
PYTHON="${PYTHON:-/usr/bin/python3}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/cpu_train_vs_torch.json}"
LLAMATRAIN="$BUILD_DIR/llamatrain"

# Fixed by the comparison; change both sides together if at all.
PRESETS="${PRESETS:-stories15m stories110m}"
PRECISIONS="${PRECISIONS:-fp32 bf16}"
STEPS_110M="${STEPS_110M:-8}"
VOCAB=32000
SEQ_LEN=256 BATCH=8 LR=3e-4 WD=0.1 CLIP=1.0 SEED=1 TIMING_WARMUP=3

die() { echo "cpu_train_vs_torch.sh: $*" >&2; exit 2; }
# Percent of all CPUs busy over one second (from /proc/stat): other work on the machine while
# nothing of ours runs. Anything well above 0 makes the timings (and the ratio) unreliable.
cpu_busy() {
  local _ u n s i w q sq st t1 i1
  read -r _ u n s i w q sq st _ < /proc/stat
  t1=$((u + n + s + i + w + q + sq + st)) i1=$((i + w))
  sleep 1
  read -r _ u n s i w q sq st _ < /proc/stat
  t1=$((u + n + s + i + w + q + sq + st - t1)) i1=$((i + w - i1))
  echo $(( t1 > 0 ? 100 * (t1 - i1) / t1 : 0 ))
}

[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "THREADS must be a positive integer (got '$THREADS')"
[[ "$STEPS" =~ ^[0-9]+$ && "$STEPS" -gt "$TIMING_WARMUP" ]] \
  || die "STEPS must exceed the $TIMING_WARMUP warm-up steps (got '$STEPS')"
TEXT="$DATA_DIR/tinystories_sample.txt"
TOKENIZER="$DATA_DIR/llama2-tokenizer.model"
[[ -f "$TEXT" && -f "$TOKENIZER" ]] || die "needs $TEXT and $TOKENIZER (the shared reference \
data beside the checkout; set DATA_DIR to where they are). Nothing was run."
[[ -x "$LLAMATRAIN" ]] || die "no $LLAMATRAIN: build it first (cmake -B $BUILD_DIR && cmake \
--build $BUILD_DIR -j) or set BUILD_DIR"
"$LLAMATRAIN" train --help >/dev/null 2>&1 || die "$LLAMATRAIN train --help fails: this build \
has no working 'train' subcommand"
"$PYTHON" -c 'import torch, h5py, numpy' 2>/dev/null || die "$PYTHON cannot import torch, h5py \
and numpy (Debian: apt-get install python3-torch python3-h5py python3-numpy)"

mkdir -p "$WORK"
DATA="$WORK/bench.h5"
echo "== machine: $(nproc) CPUs ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)); \
threads $THREADS, steps $STEPS"

# 1. Data, prepared once (rebuilt when the text or tokenizer is newer than it).
if [[ ! -s "$DATA" || "$TEXT" -nt "$DATA" || "$TOKENIZER" -nt "$DATA" ]]; then
  echo "== prepare $DATA"
  "$LLAMATRAIN" prepare --text "$TEXT" --tokenizer "$TOKENIZER" --seq-len "$SEQ_LEN" \
    --test-split 0 --output "$DATA"
fi

# The preset's shape, as llamatrain's presets define it (config.cpp).
preset_shape() {
  case "$1" in
    stories15m) DIM=288 HIDDEN=768 LAYERS=6 HEADS=6 KV_HEADS=6 ;;
    stories110m) DIM=768 HIDDEN=2048 LAYERS=12 HEADS=12 KV_HEADS=12 ;;
    *) die "unknown preset '$1' in PRESETS (stories15m, stories110m)" ;;
  esac
}

RUNS=()
for PRESET in $PRESETS; do
  preset_shape "$PRESET"
  steps="$STEPS"
  [[ "$PRESET" == stories110m ]] && steps="$STEPS_110M"
  ((steps > TIMING_WARMUP)) || die "$PRESET: steps ($steps) must exceed the $TIMING_WARMUP warm-up steps"
  # 2. llamatrain in each precision. A fresh output folder, so that no earlier checkpoint is
  #    resumed. --no-shuffle: rows in file order, the order torch_llama_train.py uses.
  for prec in $PRECISIONS; do
    tag="$PRESET.llamatrain.$prec"
    echo "== llamatrain train $PRESET --precision $prec ($THREADS threads, $steps steps)"
    rm -rf "$WORK/out" "$WORK/$tag.jsonl"
    busy="$(cpu_busy)"
    OMP_NUM_THREADS="$THREADS" "$LLAMATRAIN" train --model-config "$PRESET" --data "$DATA" \
      --batch-size "$BATCH" --grad-accum 1 --max-steps "$steps" --lr "$LR" --min-lr "$LR" \
      --warmup-steps 0 --weight-decay "$WD" --grad-clip "$CLIP" --seed "$SEED" --no-shuffle \
      --precision "$prec" --no-progress --metrics "$WORK/$tag.jsonl" --output "$WORK/out" 2>&1 \
      | tee "$WORK/$tag.log" | grep -E "warning|steps in|device|precision" || true
    RUNS+=("$PRESET llamatrain $prec $WORK/$tag.jsonl $busy")
  done
  # 3. PyTorch eager fp32 and bf16 autocast, same shapes, threads, optimizer and data rows.
  for prec in $PRECISIONS; do
    tag="$PRESET.torch.$prec"
    echo "== PyTorch $PRESET $prec ($THREADS threads, $steps steps)"
    busy="$(cpu_busy)"
    extra=()
    [[ "$prec" == bf16 ]] && extra=(--autocast-bf16)
    OMP_NUM_THREADS="$THREADS" "$PYTHON" "$REPO/benchmarks/torch_llama_train.py" \
      --dim $DIM --hidden-dim $HIDDEN --n-layers $LAYERS --n-heads $HEADS --n-kv-heads $KV_HEADS \
      --vocab-size $VOCAB --seq-len $SEQ_LEN --batch-size $BATCH --steps "$steps" \
      --timing-warmup $TIMING_WARMUP --lr $LR --weight-decay $WD --grad-clip $CLIP \
      --threads "$THREADS" --seed $SEED --data "$DATA" --json-out "$WORK/$tag.json" "${extra[@]}" \
      > "$WORK/$tag.log" 2>&1 || { tail -5 "$WORK/$tag.log"; die "PyTorch $PRESET $prec failed"; }
    tail -1 "$WORK/$tag.log"
    RUNS+=("$PRESET torch $prec $WORK/$tag.json $busy")
  done
done

# 4. Tables and results JSON.
TORCH_PKG="$(dpkg-query -W -f '${Version}' python3-torch 2>/dev/null || echo unknown)"
OMP_NUM_THREADS="$THREADS" "$PYTHON" "$REPO/benchmarks/cpu_train_table.py" --results "$RESULTS" \
  --threads "$THREADS" --batch "$BATCH" --seq "$SEQ_LEN" --warmup "$TIMING_WARMUP" \
  --torch-package "$TORCH_PKG" -- "${RUNS[@]}"
