#!/usr/bin/env bash
# CPU training throughput: llamatrain vs PyTorch eager on the same model, threads, batch,
# optimizer and data (DESIGN.md "Numbers we hold ourselves to": a CPU training step at least as
# fast as PyTorch eager).
#
# Model: the stories15m preset (dim 288, hidden 768, 6 layers, 6 heads, 6 KV heads, vocab 32000,
# tied classifier), seq 256, batch 8, AdamW lr 3e-4 (constant), betas 0.9/0.95, eps 1e-8,
# weight decay 0.1 on matrices, grad clip 1.0. Data: ../shared/data/tinystories_sample.txt
# tokenised with the real Llama 2 tokenizer. Timing: median step time after 3 warm-up steps.
#
# Usage: benchmarks/cpu_train_vs_torch.sh [--threads N] [--steps N] [--build-dir DIR]
# Environment (options win): THREADS (default: nproc), STEPS (20), BUILD_DIR (build),
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
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_train_vs_torch.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
WORK="${WORK:-$BUILD_DIR/bench/cpu_train_vs_torch}"
DATA_DIR="${DATA_DIR:-$REPO/../shared/data}"
PYTHON="${PYTHON:-/usr/bin/python3}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/cpu_train_vs_torch.json}"
LLAMATRAIN="$BUILD_DIR/llamatrain"

# Fixed by the comparison; change both sides together if at all.
PRESET=stories15m
DIM=288 HIDDEN=768 LAYERS=6 HEADS=6 KV_HEADS=6 VOCAB=32000
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

# 2. llamatrain. A fresh output folder, so that no earlier checkpoint is resumed. --no-shuffle:
#    rows in file order, the order torch_llama_train.py uses, so both see the same batches.
echo "== llamatrain train ($THREADS threads)"
rm -rf "$WORK/out" "$WORK/llamatrain.jsonl"
BUSY_LT="$(cpu_busy)"
OMP_NUM_THREADS="$THREADS" "$LLAMATRAIN" train --model-config "$PRESET" --data "$DATA" \
  --batch-size "$BATCH" --grad-accum 1 --max-steps "$STEPS" --lr "$LR" --min-lr "$LR" \
  --warmup-steps 0 --weight-decay "$WD" --grad-clip "$CLIP" --seed "$SEED" --no-shuffle \
  --metrics "$WORK/llamatrain.jsonl" --output "$WORK/out" 2>&1 | tee "$WORK/llamatrain.log"

# 3. PyTorch eager, same shapes, threads, optimizer and data rows.
echo "== PyTorch eager ($THREADS threads)"
BUSY_PT="$(cpu_busy)"
OMP_NUM_THREADS="$THREADS" "$PYTHON" "$REPO/benchmarks/torch_llama_train.py" \
  --dim $DIM --hidden-dim $HIDDEN --n-layers $LAYERS --n-heads $HEADS --n-kv-heads $KV_HEADS \
  --vocab-size $VOCAB --seq-len $SEQ_LEN --batch-size $BATCH --steps "$STEPS" \
  --timing-warmup $TIMING_WARMUP --lr $LR --weight-decay $WD --grad-clip $CLIP \
  --threads "$THREADS" --seed $SEED --data "$DATA" --json-out "$WORK/torch.json" \
  2>&1 | tee "$WORK/torch.log"

# 4. Table and results JSON.
TORCH_PKG="$(dpkg-query -W -f '${Version}' python3-torch 2>/dev/null || echo unknown)"
"$PYTHON" - "$WORK/llamatrain.jsonl" "$WORK/torch.json" "$RESULTS" "$THREADS" "$STEPS" \
  "$BATCH" "$SEQ_LEN" "$TIMING_WARMUP" "$TORCH_PKG" "$BUSY_LT" "$BUSY_PT" <<'EOF'
import json, math, os, platform, statistics, sys, time
metrics, torch_json, out, threads, steps, batch, seq, warm, torch_pkg, busy_lt, busy_pt = \
    sys.argv[1:]
threads, steps, batch, seq, warm = map(int, (threads, steps, batch, seq, warm))

recs = []
with open(metrics) as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if r.get("type", "step") == "step" and "step_ms" in r:
            recs.append(r)
recs.sort(key=lambda r: r["step"])
if len(recs) <= warm:
    sys.exit(f"{metrics}: {len(recs)} step records, need more than {warm}")
lt_ms = statistics.median(r["step_ms"] for r in recs[warm:])
lt = {"median_step_ms": lt_ms, "min_step_ms": min(r["step_ms"] for r in recs[warm:]),
      "tokens_per_s": batch * seq / lt_ms * 1e3, "losses": [r["loss"] for r in recs], "step_ms": [r["step_ms"] for r in recs],
      "grad_norms": [r.get("grad_norm") for r in recs]}
with open(torch_json) as f:
    pt = json.load(f)
pt["min_step_ms"] = min(pt["step_ms"][warm:])

ratio = lt["tokens_per_s"] / pt["tokens_per_s"]
ln_v = math.log(pt["model"]["vocab_size"])
print()
print(f"stories15m, batch {batch} x seq {seq}, {threads} threads, {steps} steps "
      f"(median after {warm} warm-up); torch {pt['torch_version']} (Debian python3-torch "
      f"{torch_pkg})")
print(f"{'':16s}{'tokens/s':>10s}{'step ms':>10s}{'(min)':>9s}{'first loss':>12s}"
      f"{'last loss':>11s}")
for name, d in (("llamatrain", lt), ("PyTorch eager", pt)):
    print(f"{name:16s}{d['tokens_per_s']:10.0f}{d['median_step_ms']:10.1f}{d['min_step_ms']:9.1f}"
          f"{d['losses'][0]:12.4f}{d['losses'][-1]:11.4f}")
print(f"CPU busy with other work just before each run: llamatrain {busy_lt}%, PyTorch "
      f"{busy_pt}% (should be ~0; other work skews the ratio)")
print(f"ratio llamatrain/PyTorch (tokens/s): {ratio:.2f}  (goal >= 1.00; "
      f"ln({pt['model']['vocab_size']}) = {ln_v:.2f})")

def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()

result = {
    "benchmark": "cpu_train_vs_torch",
    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "machine": {"cpu": cpu_model(), "nproc": os.cpu_count(),
                "cpu_busy_percent_before": {"llamatrain": int(busy_lt),
                                            "pytorch": int(busy_pt)}},
    "threads": threads, "steps": steps, "timing_warmup": warm,
    "model": pt["model"], "tied_embeddings": True, "batch_size": batch,
    "train": pt["train"],
    "llamatrain": lt,
    "pytorch": dict({k: pt[k] for k in ("torch_version", "attention", "optimizer",
                                        "median_step_ms", "min_step_ms", "tokens_per_s",
                                        "gflops_per_s", "losses", "step_ms", "grad_norms")},
                    debian_package=torch_pkg),
    "ratio_tokens_per_s_llamatrain_over_pytorch": ratio,
}
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
print(f"wrote {out}")
EOF
