#!/usr/bin/env bash
# prepare --qa tokenization speed against SentencePiece's own Encode on the same formatted texts
# (one thread), measured in the same process run by `prepare --compare-sentencepiece`.
# Data: PubMedQA ori_pqal.json with the Llama 2 tokenizer, prompt layout 3; seq 512 (about a third
# of the contexts are cut to fit and re-encoded) and seq 1024 (none cut). REPEATS runs each, the
# median ratio is printed. Target (issue 3): prepare >= 0.8x SentencePiece alone.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-$(nproc)}
REPEATS=${REPEATS:-3}
data=../shared/data
[[ -f $data/ori_pqal.json && -f $data/llama2-tokenizer.model ]] || { echo "needs ../shared/data (ori_pqal.json, llama2-tokenizer.model)"; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf "%-8s %-8s %-12s %-12s %s\n" seq_len threads prepare_tok/s sp_tok/s ratio
for seq in 512 1024; do
  ratios=()
  for ((i = 0; i < REPEATS; i++)); do
    line=$(OMP_NUM_THREADS=$THREADS "$BUILD_DIR/llamatrain" prepare --qa $data/ori_pqal.json \
      --tokenizer $data/llama2-tokenizer.model --prompt-type 3 --seq-len $seq --output "$out/p.h5" \
      --compare-sentencepiece 2>&1 | grep "prepare: tokenized")
    ours=$(sed -E 's/.* at ([0-9]+) tokens\/s.*/\1/' <<<"$line")
    sp=$(sed -E 's/.*texts: ([0-9]+) tokens\/s.*/\1/' <<<"$line")
    ratio=$(sed -E 's/.*\(ratio ([0-9.]+)\).*/\1/' <<<"$line")
    ratios+=("$ratio")
    printf "%-8s %-8s %-12s %-12s %s\n" "$seq" "$THREADS" "$ours" "$sp" "$ratio"
  done
  median=$(printf "%s\n" "${ratios[@]}" | sort -g | sed -n "$(((REPEATS + 1) / 2))p")
  echo "seq_len $seq: median ratio prepare / SentencePiece alone = $median (target >= 0.8)"
done
