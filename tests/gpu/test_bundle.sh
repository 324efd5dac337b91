#!/usr/bin/env bash
# GpuCheck.bundle: scripts/gpu-check.sh's bundling (--collect: what --bundle does after its nvcc
# build) on this build's programs. The bundle must hold every non-system library once (llamatrain's
# MPI, HDF5 and SentencePiece next to the check program's OpenBLAS), stay under 64 MiB, resolve
# every library into itself with LD_LIBRARY_PATH = its directories, and run a real job from there:
# prepare and two training steps on the CPU, with the system's library directory reduced to glibc
# when this runs as root (unshare), as on a GPU machine without our Debian packages.
#   test_bundle.sh GPU_CHECK_SH PROGRAM...   (llamatrain first)
set -euo pipefail
script=$1
shift
# shellcheck source-path=SCRIPTDIR source=script_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"

out=$(bash "$script" --collect "$tmp/bundle" "$@" 2>&1) || { echo "$out"; fail "gpu-check.sh --collect failed"; }
echo "$out" | grep -v '^  ' | tail -20
grep -q "== bundle check: every non-system library of .* resolves into" <<<"$out" || fail "no resolution check passed"
grep -q "== bundle $tmp/bundle: [0-9]* bytes" <<<"$out" || fail "the bundle's size is not printed"
bytes=$(du -sb "$tmp/bundle" | cut -f1)
((bytes <= 64 * 1024 * 1024)) || fail "bundle is $bytes bytes, over 64 MiB"
for lib in libmpi.so.40 libhdf5 libsentencepiece.so.0 libsentencepiece_train.so.0 libopenblas.so.0.gz libgomp.so.1; do
  compgen -G "$tmp/bundle/lib/$lib*" >/dev/null || fail "$lib is not carried"
done
for lib in libc.so.6 libm.so.6 ld-linux-x86-64.so.2; do
  [ ! -e "$tmp/bundle/lib/$lib" ] || fail "$lib (glibc) is carried"
done
# Each library once: no name twice, gzipped or not.
dups=$(ls "$tmp/bundle/lib" | sed 's/\.gz$//' | sort | uniq -d)
[ -z "$dups" ] || fail "carried twice: $dups"

# A job from the bundle alone. The script's functions: unpack_libs, hidden_system_run.
# shellcheck source=/dev/null
source "$script"
libs=$(unpack_libs "$tmp/bundle")
lt=$tmp/bundle/bin/llamatrain
cd "$tmp"
hidden_system_run "$libs:$tmp/bundle/lib" "$lt" prepare --text builtin:tinytales --seq-len 64 --vocab-size 512 \
  --test-split 0 --output "$tmp/data.h5" >"$tmp/prepare.log" 2>&1 || { cat "$tmp/prepare.log"; fail "prepare from the bundle"; }
head -1 "$tmp/prepare.log"
hidden_system_run "$libs:$tmp/bundle/lib" "$lt" train --device cpu --model-config tiny --data "$tmp/data.h5" \
  --batch-size 2 --max-steps 2 --no-progress --metrics "$tmp/m.jsonl" >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "train --device cpu from the bundle"; }
head -1 "$tmp/train.log"
[ "$(grep -c '"type":"step"' "$tmp/m.jsonl")" = 2 ] || fail "the bundled train did not write 2 step records"
rm -rf "$libs"
echo "PASS: bundle of $* ($bytes bytes) runs prepare and train on its own"
