#!/usr/bin/env bash
# Checkpoint write throughput against the same disk's sequential write speed with fsync, and the
# step-time stall of asynchronous checkpoints, measured in one run.
#
# 1. dd: SIZE_MB of zeros in 16 MiB blocks with conv=fsync into WORK (the disk checkpoints go to).
# 2. A training run of a ~25M-parameter Llama 2 shape (dim 512, hidden 1376, 8 layers, 8 heads,
#    vocab 512; the embedded builtin:factqa data, seq 128, batch BATCH), one rank with THREADS
#    OpenMP threads (default 1: a core left to the writer, as a GPU run leaves the host's cores
#    mostly idle; THREADS=2 measures the CPU-bound worst case), checkpointing every
#    EVERY steps for STEPS steps. Each checkpoint holds 3 fp32 arrays (weights, Adam m, v) of the
#    parameters: ~300 MB. From the metrics: write throughput = bytes / write time (HDF5 writes,
#    checksums and fsync, on the background thread), and the stall = the extra time of the steps
#    that ran while a write was in flight (against the median step without one) plus the
#    snapshot copy, compared with the write time itself (a synchronous write would stall by all of
#    it; the target is under 10%).
#
# Usage: benchmarks/checkpoint_write.sh   Environment: BUILD_DIR (build), WORK (scratch, default
#   $BUILD_DIR/bench/checkpoint; on the disk to measure), STEPS (40), EVERY (10), SIZE_MB (1024),
#   THREADS (1), BATCH (2),
#   RESULTS (benchmarks/results/checkpoint_write.json).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
BUILD_DIR="${BUILD_DIR:-build}"
WORK="${WORK:-$BUILD_DIR/bench/checkpoint}"
STEPS="${STEPS:-40}"
EVERY="${EVERY:-10}"
THREADS="${THREADS:-1}"
BATCH="${BATCH:-2}"
SIZE_MB="${SIZE_MB:-1024}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/checkpoint_write.json}"
LLAMATRAIN="$BUILD_DIR/llamatrain"
[[ -x "$LLAMATRAIN" ]] || { echo "checkpoint_write.sh: $LLAMATRAIN not built (run scripts/build.sh)" >&2; exit 2; }
mkdir -p "$WORK"
rm -rf "$WORK/ck" "$WORK/dd.bin"

dd_out=$(dd if=/dev/zero of="$WORK/dd.bin" bs=16M count=$((SIZE_MB / 16)) conv=fsync 2>&1 | tail -1)
rm -f "$WORK/dd.bin"
echo "dd: $dd_out" >&2

data="$WORK/factqa.h5"
[[ -f "$data" ]] || "$LLAMATRAIN" prepare --qa builtin:factqa --prompt-type 3 --vocab-size 512 --seq-len 128 \
    --test-split 0.1 --seed 1 --output "$data" >"$WORK/prepare.log" 2>&1
OMP_NUM_THREADS="$THREADS" "$LLAMATRAIN" train --model-config tiny --dim 512 --hidden-dim 1376 --n-layers 8 --n-heads 8 --n-kv-heads 8 \
    --data "$data" --batch-size "$BATCH" --max-steps "$STEPS" --lr 3e-4 --seed 1 --no-progress \
    --checkpoint-dir "$WORK/ck" --checkpoint-every "$EVERY" --keep-last 2 --metrics "$WORK/metrics.jsonl" \
    >"$WORK/train.log" 2>&1

python3 - "$WORK/metrics.jsonl" "$dd_out" "$RESULTS" <<'PY'
import json, re, statistics, sys
metrics, dd_out, results = sys.argv[1:]
rows = [json.loads(l) for l in open(metrics)]
steps = [r for r in rows if r["type"] == "step"]
ckpts = [r for r in rows if r["type"] == "checkpoint"]
started = {r["step"]: r["snapshot_ms"] for r in rows if r["type"] == "checkpoint_started"}
m = re.search(r"([\d.]+) s, ([\d.]+) ([GM])B/s", dd_out)
dd_mbs = float(m.group(2)) * (1000 if m.group(3) == "G" else 1)
# A checkpoint is snapshotted at the end of step s and written while steps s+1.. run; it is
# published (the "checkpoint" line) at the end of the first step that sees every rank done. The
# steps from s+1 to that one are the ones the write overlapped; the others give the baseline.
events = [(i, r) for i, r in enumerate(rows)]
overlapped = set()
for c in ckpts:
    s = c["step"]
    done_at = max(r["step"] for i, r in events if r["type"] == "step" and i < rows.index(c))
    overlapped.update(range(s + 1, done_at + 1))
quiet = [r["step_ms"] for r in steps[2:] if r["step"] not in overlapped]
base = statistics.median(quiet)
out = {"dd": dd_out, "dd_MBps": dd_mbs, "median_step_ms": base, "checkpoints": []}
print(f"disk (dd, 16 MiB blocks, fsync): {dd_mbs:.0f} MB/s")
print(f"median step without a write in flight: {base:.1f} ms")
print(f"{'step':>5} {'MB':>7} {'write s':>8} {'MB/s':>7} {'vs dd':>6} {'snapshot ms':>11} {'extra step ms':>13} {'stall/write':>11}")
for c in ckpts:
    s = c["step"]
    mb = c["rank0_bytes"] / 1e6
    w = c["rank0_write_s"]
    done_at = max(r["step"] for i, r in events if r["type"] == "step" and i < rows.index(c))
    during = [r for r in steps if s < r["step"] <= done_at]
    extra = sum(r["step_ms"] - base for r in during) + started.get(s, 0.0)
    ratio = extra / (w * 1e3)
    out["checkpoints"].append({"step": s, "MB": mb, "write_s": w, "MBps": mb / w, "vs_dd": mb / w / dd_mbs,
                               "snapshot_ms": started.get(s, 0.0), "steps_overlapped": len(during),
                               "extra_step_ms": extra, "stall_over_write": ratio})
    print(f"{s:>5} {mb:>7.1f} {w:>8.2f} {mb / w:>7.0f} {mb / w / dd_mbs:>6.2f} {started.get(s, 0.0):>11.1f} {extra:>13.1f} {ratio:>11.3f}")
json.dump(out, open(results, "w"), indent=1)
print(f"wrote {results}")
PY
