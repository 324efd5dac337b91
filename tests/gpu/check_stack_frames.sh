#!/usr/bin/env bash
# Kernels without a stack frame: compiles one kernel source for sm_80 and sm_90 with ptxas's
# report (-Xptxas -v) and requires "0 bytes stack frame" for every function whose mangled name
# contains NAME (and at least one such function per architecture). A stack frame is local memory:
# rope's sincosf carried one (its Payne-Hanek slow path for large arguments) in every block.
#   check_stack_frames.sh NVCC SOURCE NAME [NVCC_ARGS...] (e.g. -I kernels -I include)
set -euo pipefail
nvcc=$1 src=$2 name=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for arch in 80 90; do
  "$nvcc" -std=c++17 -cubin -arch="sm_$arch" -Xptxas -v "$@" "$src" -o "$tmp/k$arch.cubin" >"$tmp/ptxas$arch.txt" 2>&1 ||
    { cat "$tmp/ptxas$arch.txt"; echo "FAIL: nvcc could not compile $src for sm_$arch"; exit 1; }
  # "Function properties for NAME" is followed by "N bytes stack frame, ...".
  awk -v n="$name" -v arch="sm_$arch" '
    /Function properties for/ { f = $NF; watch = index(f, n) > 0; next }
    watch && /bytes stack frame/ { found++; printf "%s %s: %s\n", arch, f, $0; if ($1 != 0) bad++; watch = 0 }
    END { if (!found) { print "FAIL: no function matching " n " for " arch; exit 1 } exit bad > 0 }' "$tmp/ptxas$arch.txt" ||
    status=1
done
((status == 0)) && echo "ok: no stack frame in $name on sm_80 and sm_90" || echo "FAIL: a stack frame in $name (above)"
exit $status
