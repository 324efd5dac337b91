#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, then prepare the
# built-in corpus (a tokenizer is trained on it), train the `tiny` model for one epoch, evaluate
# it on the held-out split and generate from it. Everything lands in ${RUN_DIR:-runs/quickstart}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
RUN_DIR=${RUN_DIR:-runs/quickstart}
mkdir -p "$RUN_DIR"
bin=${BUILD_DIR:-build}/llamatrain

$bin info
$bin prepare --text builtin:tinytales --vocab-size 512 --seq-len 128 --test-split 0.05 --seed 1 \
    --output "$RUN_DIR/tinytales.h5"
$bin train --model-config tiny --data "$RUN_DIR/tinytales.h5" --batch-size 8 --epochs 1 \
    --lr 3e-3 --min-lr 3e-4 --warmup-steps 20 --seed 1 \
    --metrics "$RUN_DIR/metrics.jsonl" --output "$RUN_DIR"
$bin eval --model "$RUN_DIR/model.h5" --data "$RUN_DIR/tinytales.h5" --split test
$bin generate --model "$RUN_DIR/model.h5" --prompt "Once upon a time" --max-new-tokens 60 --temperature 0
