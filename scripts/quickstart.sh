#!/usr/bin/env bash
# The main job on the embedded default, end to end: install what is missing, build, then
#  1. prepare the built-in question/context/answer set (builtin:factqa:80000, 80000 yes/no/maybe
#     records in the reference format whose answers follow from the context, 400 of them held out:
#     each record is seen at most three times, so the model learns the lookup and the comparison rather
#     than the records); a tokenizer is trained on it,
#     prompts use layout 3, each answer is the evidence sentence, the asked place restated and
#     then the decision ("Tom keeps the red ball in the garden. The question asks about the
#     kitchen." then "Final decision: no", --answer-field both), the loss covers the answers only,
#     examples are packed into rows;
#  2. train the `tiny` Llama 2 with 4 layers instead of 2 (dim 64, GQA) from scratch for 3 epochs
#     (16281 steps; with 2 one seed in three stopped short on an AVX-512 machine), saving the
#     initial weights;
#  3. evaluate yes/no/maybe accuracy on the held-out examples before and after training (the model
#     writes the evidence, then each decision is scored after it);
#  4. print one answer of the trained model.
# EPOCHS, RECORDS, LAYERS and SEED (the training seed) may be set. Everything lands in ${RUN_DIR:-runs/quickstart}.
# About 8 minutes on 2 cores after the build
# (docs/benchmarks.md, "The quick start", has the accuracy measured on each kind of machine).
set -euo pipefail
cd "$(dirname "$0")/.."
# QUICKSTART_BIN: an llamatrain already built (the test Quickstart.accuracy); then nothing is
# installed or built.
if [[ -z ${QUICKSTART_BIN:-} ]]; then
  bash scripts/install-deps.sh
  bash scripts/build.sh llamatrain   # the binary only; scripts/test.sh builds the rest
fi
RUN_DIR=${RUN_DIR:-runs/quickstart}
EPOCHS=${EPOCHS:-3}
RECORDS=${RECORDS:-80000}
qa=builtin:factqa:$RECORDS
LAYERS=${LAYERS:-4}
mkdir -p "$RUN_DIR"
bin=${QUICKSTART_BIN:-${BUILD_DIR:-build}/llamatrain}

$bin info
# 400 records held out: the test split's share of RECORDS.
$bin prepare --qa "$qa" --prompt-type 3 --answer-field both --vocab-size 512 --seq-len 128 \
    --test-split "$(awk -v n="$RECORDS" 'BEGIN { printf "%.6g", 400 / n }')" --seed 1 --output "$RUN_DIR/factqa.h5"
$bin train --model-config tiny --n-layers "$LAYERS" --data "$RUN_DIR/factqa.h5" --batch-size 8 --epochs "$EPOCHS" \
    --lr 3e-3 --min-lr 3e-4 --warmup-steps 50 \
    --seed "${SEED:-1}" --save-init --metrics "$RUN_DIR/metrics.jsonl" --output "$RUN_DIR"
echo "== test accuracy before training =="
$bin eval --model "$RUN_DIR/init.h5" --task pubmedqa --qa "$qa" --ids "$RUN_DIR/factqa.h5"
echo "== test accuracy after training =="
$bin eval --model "$RUN_DIR/model.h5" --task pubmedqa --qa "$qa" --ids "$RUN_DIR/factqa.h5"
echo "== a sample answer =="
$bin generate --model "$RUN_DIR/model.h5" --prompt-type 3 --question "Is the red ball in the kitchen?" \
    --context "Tom keeps the red ball in the garden. Mia left the blue kite in the kitchen. The green hat is in the shed." \
    --max-new-tokens 40 --temperature 0
