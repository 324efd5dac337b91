#!/usr/bin/env bash
# LoRA against full fine-tuning on the CPU, measured in one run (issue 36): a stories15m-shaped
# Llama 2 (dim 288, 6 layers, 6 heads, seq 256; vocab 512 over the built-in tales) fine-tuned from
# the same initial weights for STEPS steps of batch 8 on THREADS OpenMP threads, full and with
# LoRA rank 8 on all seven products, REPEATS times each, alternating. Prints, per variant, the
# median tokens/s of the steps after the first five, the process's peak resident memory (the
# metrics' host_peak_rss_bytes at the last step), the trained parameters and the step's gradient
# volume.
#   bash benchmarks/lora_vs_full.sh [BUILD_DIR]      env: STEPS (30), THREADS (2), REPEATS (2), RANK (8)
set -euo pipefail
build=${1:-build}
bin=$(readlink -f "$build/llamatrain")
steps=${STEPS:-30} threads=${THREADS:-2} repeats=${REPEATS:-2} rank=${RANK:-8}
work=$(mktemp -d "${TMPDIR:-/tmp}/lt-lora-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
shape="--model-config stories15m --vocab-size 512"
"$bin" prepare --text builtin:tinytales --vocab-size 512 --seq-len 256 --test-split 0.01 --seed 1 \
  --output "$work/tales.h5" >/dev/null 2>&1
"$bin" train $shape --data "$work/tales.h5" --max-steps 1 --save-init --output "$work/base" --no-progress >/dev/null 2>&1
run() {  # run NAME ARGS...
  local name=$1; shift
  "$bin" train --init-from "$work/base/init.h5" --data "$work/tales.h5" --batch-size 8 --max-steps "$steps" \
    --lr 1e-3 --seed 3 --no-progress --metrics "$work/$name.jsonl" "$@" >"$work/$name.log" 2>&1
  python3 - "$work/$name.jsonl" "$name" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [s for s in steps if s.get("type") == "step"]
tps = statistics.median(s["tokens_per_s"] for s in steps[5:])
print(f"{sys.argv[2]}\t{tps:.0f}\t{steps[-1]['host_peak_rss_bytes'] / 2**20:.0f}\t{steps[-1]['loss']:.4f}")
PY
}
printf 'variant\ttokens/s\tpeak RSS MiB\tlast loss\n'
for ((r = 1; r <= repeats; ++r)); do
  run "full-$r"
  run "lora$rank-$r" --lora-rank "$rank" --lora-alpha $((2 * rank))
done
python3 - "$work" "$rank" <<'PY'
import sys
work, r = sys.argv[1], int(sys.argv[2])
C, F, L = 288, 768, 6  # stories15m: tied embeddings, no GQA
full = 512 * C + L * (4 * C * C + 3 * C * F + 2 * C) + C
lora = L * r * ((C + C) * 4 + (C + F) * 3)
print(f"trained parameters: full {full}, LoRA rank {r} {lora} ({100 * lora / full:.2f}%); "
      f"a step's gradient all-reduce moves the same ratio of bytes")
PY
