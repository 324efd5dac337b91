#!/usr/bin/env bash
# Runs every ```sh block of README.md and docs/*.md (fenced with ```sh exactly; ```text and plain
# ``` blocks are never run) on small data, and fails when any block fails.
#
#   bash tests/docs/run_doc_examples.sh LLAMATRAIN SOURCE_DIR
#
# Each page gets a fresh working directory; its blocks run there in order, each in a fresh
# `bash -e -o pipefail`, so later blocks see the files made by earlier ones. In that directory
# `llamatrain` is on PATH (a symlink to LLAMATRAIN), `hostfiles` is a symlink to SOURCE_DIR/hostfiles,
# and `../shared/data` is a symlink to SOURCE_DIR/../shared/data (the reference files) when that
# exists. Without it, or with LT_DOCS_NO_SHARED=1 (a clone without ../shared), a block that
# mentions ../shared/data is skipped with a message, and so is a later block of the same page that
# mentions a file a skipped block writes (`--output X`, `> X`). A block that fails because this
# CPU has no bf16 matrix products (train --precision bf16 without AVX-512) counts as skipped.
#
# Substitutions, applied to each command (backslash-continued lines joined) before it runs, so
# that the whole run stays within a few minutes on 2 cores:
#   build/llamatrain                      -> llamatrain (the symlink on PATH)
#   train: --epochs N                     -> --max-steps 3
#   train: --max-steps N                  -> --max-steps 3 (when N > 3)
#   train: --batch-size N                 -> --batch-size 1
#   train: --grad-accum N                 -> --grad-accum 1
#   train: --model-config llama2-*        -> --model-config tiny   (plan keeps llama2-*: it only computes)
#   prepare --text, eval --text: --seq-len N -> --seq-len 64 (when N > 64; prepare --qa keeps its
#                                            --seq-len, the records must fit)
#   eval --task: --ids ../shared/data/test_ground_truth.json -> a file with its first 8 ids
#   generate: --max-new-tokens N          -> --max-new-tokens 16 (when N > 16)
#   prepare --text ../shared/data/F.txt   -> its first 100 KB (a smaller test split to evaluate)
# Nothing else changes: options, file names and the order of the blocks are the page's own.
# mpirun runs as root through OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), set here when unset.
set -uo pipefail
if (($# != 2)); then echo "usage: $0 LLAMATRAIN SOURCE_DIR" >&2; exit 2; fi
bin=$(readlink -f "$1"); src=$(readlink -f "$2")
[[ -x $bin ]] || { echo "run_doc_examples: $1: not an executable" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Passive waiting: CTest runs this beside other tests on CI's 2 cores, where OpenMP's default
# spinning made a block's evals about 10 times slower (docs/lora.md's timed out at 180 s).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
block_timeout=${LT_DOCS_BLOCK_TIMEOUT:-180}

work=$(mktemp -d "${TMPDIR:-/tmp}/llamatrain-docs.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/run"
ln -s "$bin" "$work/bin/llamatrain"
export PATH="$work/bin:$PATH"
have_shared=0
if [[ -z ${LT_DOCS_NO_SHARED:-} && -d $src/../shared/data ]]; then
  have_shared=1
  mkdir -p "$work/shared"
  ln -s "$(readlink -f "$src/../shared/data")" "$work/shared/data"
  # eval --task on 8 ids instead of 500 (one example takes about a second here)
  if command -v python3 >/dev/null && [[ -f $work/shared/data/test_ground_truth.json ]]; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); json.dump(sorted(d)[:8], open(sys.argv[2],"w"))' \
      "$work/shared/data/test_ground_truth.json" "$work/ids8.json"
  fi
  for t in "$work"/shared/data/*.txt; do head -c 100000 "$t" > "$work/$(basename "$t")"; done
  echo "run_doc_examples: ../shared/data = $(readlink -f "$src/../shared/data")"
else
  echo "run_doc_examples: no ../shared/data${LT_DOCS_NO_SHARED:+ (LT_DOCS_NO_SHARED set)}: blocks that need it are skipped"
fi

# The substitutions above, on one block read from stdin.
substitute() {
  WORKDIR="$work" IDS8="$work/ids8.json" perl -e '
    local $/; my $t = <STDIN>;
    $t =~ s/\\\n\s*/ /g;                                  # join continuation lines
    my $ids8 = $ENV{IDS8};
    my @out;
    for my $l (split /\n/, $t, -1) {
      $l =~ s{(^|[\s/])build/llamatrain\b}{$1 eq "/" ? "/llamatrain" : "${1}llamatrain"}ge;
      if ($l =~ /\bllamatrain\s+(?:--config\s+\S+\s+)?(train|prepare|eval|generate)\b/) {
        my $cmd = $1;
        if ($cmd eq "train") {
          $l =~ s/--epochs\s+\d+/--max-steps 3/g;
          $l =~ s/--max-steps\s+(\d+)/"--max-steps " . ($1 > 3 ? 3 : $1)/ge;
          $l =~ s/--batch-size\s+\d+/--batch-size 1/g;
          $l =~ s/--grad-accum\s+\d+/--grad-accum 1/g;
          $l =~ s/--model-config\s+llama2-\w+/--model-config tiny/g;
        }
        if (($cmd eq "prepare" || $cmd eq "eval") && $l =~ /--text\s/) {
          $l =~ s/--seq-len\s+(\d+)/"--seq-len " . ($1 > 64 ? 64 : $1)/ge;
        }
        if ($cmd eq "prepare") {
          $l =~ s{--text\s+\.\./shared/data/(\S+\.txt)}{"--text " . $ENV{WORKDIR} . "/$1"}ge;
        }
        if ($cmd eq "eval" && -f $ids8) {
          $l =~ s{--ids\s+\.\./shared/data/test_ground_truth\.json}{--ids $ids8}g;
        }
        if ($cmd eq "generate") {
          $l =~ s/--max-new-tokens\s+(\d+)/"--max-new-tokens " . ($1 > 16 ? 16 : $1)/ge;
        }
      }
      push @out, $l;
    }
    print join("\n", @out);'
}

n_run=0; n_skip=0; n_fail=0
[[ $have_shared == 1 ]] && ln -s "$work/shared" "$work/run/shared"   # ../shared/data from a page's directory
pages=("$src/README.md")
for p in "$src"/docs/*.md; do [[ -f $p ]] && pages+=("$p"); done
for page in "${pages[@]}"; do
  rel=${page#"$src"/}
  dir="$work/run/$(echo "$rel" | tr '/.' '__')"
  mkdir -p "$dir"; ln -s "$src/hostfiles" "$dir/hostfiles"
  blocks="$work/blocks"; rm -rf "$blocks"; mkdir -p "$blocks"
  awk -v out="$blocks" '
    /^```sh[ \t]*$/ && !inb { inb = 1; n++; f = sprintf("%s/%03d.sh", out, n); printf "" > f; next }
    /^```/ && inb { inb = 0; close(f); next }
    inb { print >> f }' "$page"
  missing=()   # files written by skipped blocks of this page
  for b in "$blocks"/*.sh; do
    [[ -f $b ]] || continue
    num=$((10#$(basename "$b" .sh)))
    why=""
    if [[ $have_shared == 0 ]] && grep -q '\.\./shared/data' "$b"; then
      why="needs ../shared/data"
    else
      for m in "${missing[@]}"; do
        if grep -qF -- "$m" "$b"; then why="needs $m, made by a skipped block"; break; fi
      done
    fi
    if [[ -n $why ]]; then
      echo "SKIP $rel block $num: $why"
      n_skip=$((n_skip + 1))
      while read -r f; do [[ -n $f ]] && missing+=("${f%/}"); done < <(
        grep -oE -- '(--output|>) *[^ ;&|]+' "$b" | sed -E 's/^(--output|>) *//')
      continue
    fi
    substitute < "$b" > "$b.run"
    start=$SECONDS
    (cd "$dir" && timeout "$block_timeout" bash -e -o pipefail "$b.run") > "$b.out" 2> "$b.err" < /dev/null
    rc=$?
    if ((rc == 0)); then
      echo "ok   $rel block $num ($((SECONDS - start)) s)"
      n_run=$((n_run + 1))
    elif grep -qF "has no bf16 matrix products for this CPU's ISA" "$b.err"; then
      # --precision bf16 on a CPU without AVX-512: train refuses it by design (docs/usage.md).
      echo "SKIP $rel block $num: this CPU has no bf16 matrix products ($(grep -oE 'ISA, [a-z0-9_]+' "$b.err" | head -1))"
      n_skip=$((n_skip + 1))
    else
      n_run=$((n_run + 1)); n_fail=$((n_fail + 1))
      echo "FAIL $rel block $num: exit status $rc$( ((rc == 124)) && echo " (timed out after $block_timeout s)")"
      echo "  command (after substitution):"; grep -v '^\s*#' "$b.run" | grep -v '^\s*$' | sed 's/^/    /'
      echo "  stderr (last 15 lines):"; tail -n 15 "$b.err" | sed 's/^/    /'
    fi
  done
done
echo "run_doc_examples: $n_run blocks run, $n_skip skipped, $n_fail failed"
((n_fail == 0))
