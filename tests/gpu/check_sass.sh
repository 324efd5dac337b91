#!/usr/bin/env bash
# The SASS of the nvcc build holds the instructions a kernel was written for: for each architecture
# in the library (sm_80 and sm_90 are both required), every kernel whose mangled name contains
# NAME must contain each listed SASS mnemonic (prefix match: HMMA matches HMMA.16816.F32.BF16).
# Prints the counts per kernel and architecture. With EXPECT_KERNELS=n, exactly n kernels must match
# per architecture (a kernel that disappears from the build is noticed too).
#
#   check_sass.sh LIB NAME MNEMONIC... (e.g. libllamatrain_kernels_cuda.a attention_tc_ HMMA LDSM LDGSTS)
#
# Tools: cuobjdump and nvdisasm from $CUOBJDUMP / $NVDISASM, PATH, $CUDA_BIN (the toolkit's bin),
# or the PyPI wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (nvidia/cu*/bin in python3's
# site-packages). Neither is needed to build; without them the test exits 77 (CTest: Skipped).
set -euo pipefail
lib=$1 name=$2
shift 2
mnemonics=("$@")

find_tool() {  # find_tool NAME ENV_VALUE
  local tool=$1 given=$2 d
  if [[ -n $given && -x $given ]]; then echo "$given"; return; fi
  if command -v "$tool" >/dev/null 2>&1; then command -v "$tool"; return; fi
  if [[ -n ${CUDA_BIN:-} && -x $CUDA_BIN/$tool ]]; then echo "$CUDA_BIN/$tool"; return; fi
  if command -v python3 >/dev/null 2>&1; then
    for d in $(python3 -c 'import nvidia, os; print(" ".join(nvidia.__path__))' 2>/dev/null); do
      for f in "$d"/cu*/bin/"$tool"; do [[ -x $f ]] && { echo "$f"; return; }; done
    done
  fi
  return 0  # not found: empty (a python with other nvidia wheels, e.g. torch's, has no cuobjdump)
}
cuobjdump=$(find_tool cuobjdump "${CUOBJDUMP:-}")
nvdisasm=$(find_tool nvdisasm "${NVDISASM:-}")
if [[ -z $cuobjdump || -z $nvdisasm ]]; then
  echo "SKIP: cuobjdump and nvdisasm are needed to read the SASS and were not found (PATH, the CUDA" \
    "toolkit's bin, or 'pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm')"
  exit 77
fi
[[ -f $lib ]] || { echo "FAIL: $lib not found (build the target llamatrain_kernels_cuda first)"; exit 1; }
echo "cuobjdump: $cuobjdump"
echo "nvdisasm:  $nvdisasm"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lib_abs=$(realpath "$lib")
(cd "$work" && "$cuobjdump" -xelf all "$lib_abs" >/dev/null)

fail=0
for arch in sm_80 sm_90; do
  shopt -s nullglob
  cubins=()
  for c in "$work"/*."$arch".cubin; do grep -qa -- "$name" "$c" && cubins+=("$c"); done  # names in the symbol table
  shopt -u nullglob
  if ((${#cubins[@]} == 0)); then
    echo "FAIL: no $arch code of a kernel named *$name* in $lib"
    fail=1
    continue
  fi
  # One line per kernel: name, then the count of each mnemonic in its .text section.
  table=$(for c in "${cubins[@]}"; do "$nvdisasm" "$c"; done | awk -v name="$name" -v list="${mnemonics[*]}" '
    BEGIN { n = split(list, m, " ") }
    /^\/\/-+ \.text\./ { fn = $2; sub(/^\.text\./, "", fn); inside = index(fn, name) > 0; if (inside) seen[fn] = 1; next }
    /^\/\/-+ / { inside = 0; next }
    inside {
      for (i = 1; i <= n; ++i) {
        line = $0
        while (match(line, "[ ;{}]" m[i] "[ .]")) { cnt[fn, i]++; line = substr(line, RSTART + RLENGTH) }
      }
    }
    END { for (f in seen) { printf "%s", f; for (i = 1; i <= n; ++i) printf " %d", cnt[f, i] + 0; printf "\n" } }' | sort)
  if [[ -z $table ]]; then
    echo "FAIL: no $arch kernel whose name contains '$name'"
    fail=1
    continue
  fi
  found=$(wc -l <<<"$table")
  if [[ -n ${EXPECT_KERNELS:-} && $found -ne $EXPECT_KERNELS ]]; then
    echo "FAIL: $arch has $found kernels named *$name*, expected $EXPECT_KERNELS"
    fail=1
  fi
  echo "$arch: kernel ${mnemonics[*]}"
  while read -r fn counts; do
    echo "  $fn $counts"
    i=0
    for c in $counts; do
      if ((c == 0)); then
        echo "FAIL: $arch $fn has no ${mnemonics[$i]}"
        fail=1
      fi
      i=$((i + 1))
    done
  done <<<"$table"
done
((fail == 0)) && echo "PASS: every '$name' kernel has ${mnemonics[*]} on sm_80 and sm_90"
exit $fail
