#!/usr/bin/env bash
# Checkpoint write throughput against the same disk's sequential write speed with fsync, and the
# step-time stall of asynchronous checkpoints, measured in one run.
#
# Model: a ~25M-parameter Llama 2 shape (dim 512, hidden 1376, 8 layers, 8 heads, vocab 512) on the
# embedded builtin:factqa data (seq 128); a checkpoint holds weights, Adam m and v in fp32: ~310 MB.
#
# 1. Throughput, REPEATS times: dd copies 320 MiB of random bytes (about a checkpoint; a file
#    already in the page cache, since zeros may be cheaper for a virtual disk to store) in 16 MiB
#    blocks with conv=fsync into WORK, then a one-step run (no test split, so nothing runs beside
#    the write) writes one
#    checkpoint there; throughput = bytes / time of the write (HDF5 writes, checksums, fsync).
#    The medians of both are compared (target: at least 70% of dd).
# 2. Stall: a run of STEPS steps with a checkpoint every EVERY steps, written in the background.
#    For each checkpoint, the extra time of the steps that overlapped its write (against the
#    median step that overlapped none) plus the snapshot copy on the training thread, as a
#    fraction of the write time (a synchronous write would stall by all of it; target: under 10%).
#    Training uses THREADS OpenMP threads (default 1: a core left to the writer, as a GPU run
#    leaves the host's cores mostly idle); the writer runs at SCHED_IDLE.
#
# Usage: benchmarks/checkpoint_write.sh   Environment: BUILD_DIR (build), WORK (scratch, default
#   $BUILD_DIR/bench/checkpoint; on the disk to measure), REPEATS (3), STEPS (60), EVERY (5),
#   THREADS (1), BATCH (1), RESULTS (benchmarks/results/checkpoint_write.json).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
BUILD_DIR="${BUILD_DIR:-build}"
WORK="${WORK:-$BUILD_DIR/bench/checkpoint}"
REPEATS="${REPEATS:-3}"
STEPS="${STEPS:-60}"
EVERY="${EVERY:-5}"
THREADS="${THREADS:-1}"
BATCH="${BATCH:-1}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/checkpoint_write.json}"
LLAMATRAIN="$BUILD_DIR/llamatrain"
[[ -x "$LLAMATRAIN" ]] || { echo "checkpoint_write.sh: $LLAMATRAIN not built (run scripts/build.sh)" >&2; exit 2; }
mkdir -p "$WORK"
model=(--model-config tiny --dim 512 --hidden-dim 1376 --n-layers 8 --n-heads 8 --n-kv-heads 8 --lr 3e-4 --seed 1
       --no-progress)

# Data: with and without a test split (the throughput runs must not evaluate beside the write).
for split in 0 0.1; do
  d="$WORK/factqa_$split.h5"
  [[ -f "$d" ]] || "$LLAMATRAIN" prepare --qa builtin:factqa --prompt-type 3 --vocab-size 512 --seq-len 128 \
      --test-split "$split" --seed 1 --output "$d" >"$WORK/prepare.log" 2>&1
done

: >"$WORK/throughput.txt"
[[ -f "$WORK/random.bin" ]] || head -c $((320 << 20)) /dev/urandom >"$WORK/random.bin"
cat "$WORK/random.bin" >/dev/null  # into the page cache: dd then measures the writes alone
for ((i = 1; i <= REPEATS; ++i)); do
  rm -rf "$WORK/ck1" "$WORK/dd.bin"
  dd_out=$(dd if="$WORK/random.bin" of="$WORK/dd.bin" bs=16M conv=fsync 2>&1 | tail -1)
  rm -f "$WORK/dd.bin"
  # The same copy bypassing the page cache, as the checkpoint's arrays are written: the disk's own
  # speed, without the kernel's copy into the page cache that bounds buffered dd on a busy CPU.
  dd_direct=$(dd if="$WORK/random.bin" of="$WORK/dd.bin" bs=16M oflag=direct conv=fsync 2>&1 | tail -1)
  rm -f "$WORK/dd.bin"
  OMP_NUM_THREADS="$THREADS" "$LLAMATRAIN" train "${model[@]}" --data "$WORK/factqa_0.h5" --batch-size "$BATCH" \
      --max-steps 1 --checkpoint-dir "$WORK/ck1" --metrics "$WORK/throughput_$i.jsonl" >"$WORK/throughput_$i.log" 2>&1
  echo "$dd_out|$WORK/throughput_$i.jsonl|$dd_direct" >>"$WORK/throughput.txt"
  echo "repeat $i: dd $dd_out; dd oflag=direct $dd_direct" >&2
done

rm -rf "$WORK/ck"
OMP_NUM_THREADS="$THREADS" "$LLAMATRAIN" train "${model[@]}" --data "$WORK/factqa_0.1.h5" --batch-size "$BATCH" \
    --max-steps "$STEPS" --checkpoint-dir "$WORK/ck" --checkpoint-every "$EVERY" --keep-last 2 \
    --metrics "$WORK/metrics.jsonl" >"$WORK/train.log" 2>&1

python3 - "$WORK/throughput.txt" "$WORK/metrics.jsonl" "$RESULTS" <<'PY'
import json, re, statistics, sys
tp_file, metrics, results = sys.argv[1:]

def mbps(dd_out):
    m = re.search(r"([\d.]+) ([GM])B/s", dd_out)
    return float(m.group(1)) * (1000 if m.group(2) == "G" else 1)

tp = []
for line in open(tp_file):
    dd_out, path, dd_direct = line.rstrip("\n").split("|")
    ck = [j for j in map(json.loads, open(path)) if j["type"] == "checkpoint"][0]
    tp.append({"dd_MBps": mbps(dd_out), "dd_direct_MBps": mbps(dd_direct),
               "write_MBps": ck["rank0_bytes"] / 1e6 / ck["rank0_write_s"],
               "write_s": ck["rank0_write_s"], "MB": ck["rank0_bytes"] / 1e6})
dd_med = statistics.median(t["dd_MBps"] for t in tp)
ddd_med = statistics.median(t["dd_direct_MBps"] for t in tp)
wr_med = statistics.median(t["write_MBps"] for t in tp)
print("throughput (one checkpoint written with nothing else running, right after dd):")
for i, t in enumerate(tp, 1):
    print(f"  repeat {i}: dd {t['dd_MBps']:.0f} MB/s (oflag=direct {t['dd_direct_MBps']:.0f}), checkpoint "
          f"{t['MB']:.0f} MB in {t['write_s']:.2f} s = {t['write_MBps']:.0f} MB/s ({t['write_MBps'] / t['dd_MBps']:.2f} of dd, "
          f"{t['write_MBps'] / t['dd_direct_MBps']:.2f} of dd oflag=direct)")
print(f"  median: checkpoint {wr_med:.0f} MB/s vs dd {dd_med:.0f} MB/s = {wr_med / dd_med:.2f} (target >= 0.70); "
      f"vs dd oflag=direct {ddd_med:.0f} MB/s = {wr_med / ddd_med:.2f}")

rows = [json.loads(l) for l in open(metrics)]
steps = [r for r in rows if r["type"] == "step"]
ckpts = [(i, r) for i, r in enumerate(rows) if r["type"] == "checkpoint"]
started = {r["step"]: r["snapshot_ms"] for r in rows if r["type"] == "checkpoint_started"}
# A checkpoint snapshotted at the end of step s is written while steps s+1.. run, and published at
# the end of the first step that sees every rank done: those steps overlapped the write.
spans = []
for i, c in ckpts:
    done_at = max(r["step"] for r in rows[:i] if r["type"] == "step")
    spans.append((c, range(c["step"] + 1, done_at + 1)))
overlapped = {s for _, span in spans for s in span}
base = statistics.median(r["step_ms"] for r in steps[2:] if r["step"] not in overlapped)
stall = []
print(f"stall (async, {len(spans)} checkpoints; median step without a write {base:.0f} ms):")
for c, span in spans:
    if not span:
        continue  # the last one, finished after training
    extra = sum(r["step_ms"] - base for r in steps if r["step"] in span) + started.get(c["step"], 0.0)
    stall.append({"step": c["step"], "write_s": c["rank0_write_s"], "snapshot_ms": started.get(c["step"], 0.0),
                  "steps_overlapped": len(span), "extra_ms": extra, "stall_over_write": extra / (c["rank0_write_s"] * 1e3)})
    print(f"  step {c['step']:>3}: write {c['rank0_write_s']:.2f} s, snapshot {started.get(c['step'], 0):.0f} ms, "
          f"{len(span)} step(s) overlapped, extra {extra:.0f} ms = {stall[-1]['stall_over_write']:.2f} of the write")
med_stall = statistics.median(s["stall_over_write"] for s in stall)
med_snap = statistics.median(s["snapshot_ms"] / (s["write_s"] * 1e3) for s in stall)
print(f"  median stall {med_stall:.3f} of the write time (snapshot copy alone {med_snap:.3f}; target < 0.10)")
json.dump({"throughput": tp, "dd_median_MBps": dd_med, "write_median_MBps": wr_med, "ratio": wr_med / dd_med,
           "dd_direct_median_MBps": ddd_med, "ratio_to_direct": wr_med / ddd_med,
           "median_step_ms": base, "stall": stall, "median_stall_over_write": med_stall,
           "median_snapshot_over_write": med_snap}, open(results, "w"), indent=1)
print(f"wrote {results}")
PY
