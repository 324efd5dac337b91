#!/usr/bin/env bash
# GpuCheck.device_peak_bytes: train's step records on the CUDA backend (here the simulator) carry
# device_peak_bytes, the allocator's high-water mark, and it is at least what the device must hold
# for the parameters (bf16 working copy, 2 bytes each) and their gradients (fp32, 4 bytes each).
#   test_device_peak.sh LLAMATRAIN
set -euo pipefail
lt=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
"$lt" prepare --text builtin:tinytales --seq-len 64 --vocab-size 512 --test-split 0 --output data.h5 >prepare.log 2>&1 ||
  { cat prepare.log; exit 1; }
"$lt" train --device cuda-sim --model-config tiny --data data.h5 --batch-size 2 --max-steps 3 --no-progress \
  --metrics m.jsonl >train.log 2>&1 || { cat train.log; exit 1; }
python3 - m.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
n = next(r for r in recs if r["type"] == "memory")["n_params"]
steps = [r for r in recs if r["type"] == "step"]
assert len(steps) == 3, f"{len(steps)} step records"
for r in steps:
    peak = r.get("device_peak_bytes")
    assert peak is not None, f"step {r['step']}: no device_peak_bytes"
    assert peak >= n * (2 + 4), f"step {r['step']}: device_peak_bytes {peak} < {n} parameters x 6 bytes"
    assert "device_driver_used_peak_bytes" not in r, "the simulator has no driver figure"
peaks = [r["device_peak_bytes"] for r in steps]
assert peaks == sorted(peaks), f"a high-water mark that falls: {peaks}"
print(f"PASS: device_peak_bytes {peaks} >= {n} parameters x 6 bytes = {n * 6}")
PY
