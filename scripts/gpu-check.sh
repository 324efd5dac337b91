#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (DESIGN.md, "Testing without a GPU", point 3): the kernel tests
# on the device against the CPU backend, then kernel benchmarks on Llama-2-7b shapes with a table of
# time, GB/s (against the measured device-to-device copy bandwidth) and TFLOP/s (attention, against
# the measured cuBLAS bf16 GEMM rate), then the sharded stages (ZeRO 1, 2, 3 and 3 with the optimizer
# offloaded: the same losses, device memory as the tables say; step_zero), then a training benchmark: `llamatrain train --device cuda` on
# Llama-2-7b layer shapes at sequence 4096 (all 32 layers if the planner says they fit the GPU,
# otherwise the most that fit), with tokens/s, MFU and the peak device memory against the planner's
# prediction. The whole GPU run stays under 8 minutes.
#
#   scripts/gpu-check.sh --bundle [DIR]
#       On the development machine (no GPU needed): build the device programs (sm_80 + sm_90 SASS,
#       PTX for forward compatibility) in ${GPU_BUILD_DIR:-build-gpu}: llamatrain_gpu_check and
#       llamatrain itself; copy them with the non-system shared libraries ldd lists (OpenBLAS,
#       libgfortran, libgomp, libstdc++, Open MPI, HDF5 and libcurl's chain, SentencePiece, ...) into
#       DIR (default build-gpu/bundle, git-ignored), each library once; libraries over 8 MiB
#       (OpenBLAS) are stored gzipped and unpacked on the GPU machine. Writes DIR/MANIFEST, checks
#       that every non-system library resolves into DIR, starts the programs with only DIR's
#       libraries (the system's copies hidden when this runs as root with unshare), and fails if
#       DIR exceeds 64 MiB. The CUDA libraries (cuBLAS, cuBLASLt) are not carried: the GPU machine
#       has the toolkit; cudart is linked statically. cuDNN (for the cuDNN attention check and
#       benchmark rows) is not carried either: it is opened with dlopen and looked for on the GPU
#       machine (cudnn_lib_dirs).
#   scripts/gpu-check.sh --collect DIR PROGRAM...
#       The same bundling of programs already built (no nvcc build): for tests.
#   scripts/gpu-check.sh [--bundle-dir DIR] [--budget SECONDS] [--steps kernels,zero,train]
#       On the GPU machine, from the repository root: run the bundle in DIR (default build-gpu/bundle);
#       without one, build here for the local GPU (CMAKE_CUDA_ARCHITECTURES=native) if this machine
#       has our packages. Output goes to the terminal and to $OUT/gpu-check/ when OUT is set
#       (otherwise build-gpu/results/<time>/): gpu-check.log, probe.txt, kernel-checks.tsv,
#       kernels-table.md, zero-table.md, train-table.md, summary.md (the last lines printed), zero/
#       and train/ (the steps' logs, plans and metrics).
#   Training step options: --train-model NAME (llama2-7b) --train-seq-len T (4096) --train-steps N
#       (10) --train-micro-batches M (4: a global batch of M sequences a step, accumulated, so the
#       optimizer's once-a-step work weighs on tokens/s and MFU as in a real run) --train-layers K
#       (default: the planner decides) --train-recompute none|attn|full (default: the cheapest
#       that fits the most layers; passed only if `train --help` lists it) --train-attention
#       native|cudnn (native: ours; cudnn: cuDNN's fused attention, for the comparison)
#       --train-memory-bytes B (default: the GPU's memory.total) --train-host-bytes B (default:
#       MemTotal) --train-device cuda|cuda-sim;
#       with cuda-sim no GPU is needed and --bin-dir DIR takes the programs from a build directory
#       (the CTest test of this step). The zero step uses the same model (ZERO_LAYERS layers of it),
#       sequence (at most 512) and device.
#
# First a probe (probe.txt): GPUs, driver, where each CUDA library was found, memory, cores. The
# kernels step writes kernel-checks.tsv and kernels-table.md row by row, and starts its program again
# after a family that raised a sticky CUDA error (step_kernels).
#
# Exit status: 0 every step passed; 1 a check failed; 2 no GPU here (nothing was run);
# 3 could not build or run (missing libraries, CUDA error, time budget exceeded); 64 bad usage.
#
# Adding a step: build its program in the bundle (append it to PROGRAMS), write a step_<name>
# function that calls run_program (or run_logged), and append <name> to STEPS.

# step_<name> functions are called through "step_$step":
# shellcheck disable=SC2317
# No -e: a failing step is recorded and the later steps and the summary still run (fail soft).
set -uo pipefail

BUILD_DIR=${GPU_BUILD_DIR:-build-gpu}
BUNDLE_DIR=build-gpu/bundle
JOBS=${JOBS:-2}
BUDGET=${GPU_CHECK_BUDGET:-460}   # seconds for the whole GPU run (the issue asks for < 8 minutes)
MAX_BUNDLE_BYTES=$((64 * 1024 * 1024))
# Libraries larger than this are stored gzipped: OpenBLAS (36 MB, 11 MB gzipped) next to what
# llamatrain needs besides (MPI, HDF5 with libcurl's chain, SentencePiece: about 25 MB) would take
# the bundle over 64 MiB.
GZIP_OVER_BYTES=$((8 * 1024 * 1024))
PROGRAMS=(llamatrain_gpu_check llamatrain)  # the programs the bundle carries
STEPS=(kernels zero train)                  # the steps of a GPU run, in order
# The steps' caps add up to at most the budget (200 + 70 + 180 = 450 of 460 s), so a step that
# runs to its cap never takes the next one's time.
# GPU_CHECK_*_CAP change them (the rehearsal on the simulator, tests/gpu/test_rehearsal.sh).
KERNELS_CAP=${GPU_CHECK_KERNELS_CAP:-200}   # seconds for the kernel checks and benchmarks
KERNELS_PROGRAM=${KERNELS_PROGRAM:-llamatrain_gpu_check}  # step_kernels' program
ZERO_CAP=${GPU_CHECK_ZERO_CAP:-70}          # seconds for the sharded stages' check (data, 6 runs)
TRAIN_CAP=${GPU_CHECK_TRAIN_CAP:-180}       # seconds for the training step (data, plans, training)
ZERO_LAYERS=2                               # layers of TRAIN_MODEL's shapes in the zero step
ZERO_STEPS=6
TRAIN_DEVICE=cuda
TRAIN_MODEL=llama2-7b
TRAIN_SEQ_LEN=4096
TRAIN_STEPS=10
TRAIN_MICRO_BATCHES=4
TRAIN_LAYERS=""      # empty: the planner decides
TRAIN_RECOMPUTE=""   # empty: the cheapest that fits the most layers
TRAIN_ATTENTION=native
TRAIN_MEMORY_BYTES=""
TRAIN_HOST_BYTES=""  # default: MemTotal (MemAvailable starts low on a VM that grows its memory on demand)
BIN_DIR_ARG=""

die() {
  local code=$1
  shift
  echo "gpu-check: $*" >&2
  exit "$code"
}

usage() {
  sed -n '2,/^$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

# ---- bundle (development machine) ------------------------------------------------------------------

# Libraries every Linux machine provides (glibc, the loader) or that must come from the GPU machine
# itself (the driver, and the CUDA toolkit's libraries, which must match its driver); all else is carried.
is_system_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | \
      libresolv.so* | libutil.so* | libcuda.so* | libnvidia*.so* | libcudart.so* | libcublas.so* | \
      libcublasLt.so* | libnccl.so* | libcudnn*.so* | libnvrtc*.so*) return 0 ;;
  esac
  return 1
}

make_bundle() {
  local dir=$1
  case "$dir" in
    /* | ..*) die 64 "--bundle DIR must be a path inside the repository (the device tool carries it)" ;;
  esac
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die 3 "no nvcc: the bundle needs the CUDA toolkit"
  echo "== configure $BUILD_DIR (nvcc, sm_80 + sm_90)"
  mkdir -p "$BUILD_DIR"
  local log=$BUILD_DIR/gpu-check-configure.log
  # CMAKE_ARGS: extra -D options, split on spaces on purpose.
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DLLAMATRAIN_CUDA=ON -DLLAMATRAIN_TESTS=OFF \
    -DLLAMATRAIN_BENCHMARKS=OFF -DLLAMATRAIN_SIM_ASAN=OFF ${CMAKE_ARGS:-} >"$log" 2>&1 ||
    { tail -30 "$log"; die 3 "configure failed (log: $log)"; }
  echo "== build ${PROGRAMS[*]} (-j $JOBS)"
  log=$BUILD_DIR/gpu-check-build.log
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${PROGRAMS[@]}" >"$log" 2>&1 ||
    { grep -E "error|Error" "$log" | head -30; die 3 "build failed (log: $log)"; }

  local paths=() prog path
  for prog in "${PROGRAMS[@]}"; do
    # Not the copy in an earlier bundle under BUILD_DIR (bundle_programs deletes that first).
    path=$(find "$BUILD_DIR" -path "${dir%/}" -prune -o -type f -name "$prog" -perm -u+x -print | head -1)
    [ -n "$path" ] || die 3 "built $prog but cannot find it under $BUILD_DIR"
    paths+=("$path")
  done
  bundle_programs "$dir" "${paths[@]}"
  echo "run it on the GPU machine from the repository root: bash scripts/gpu-check.sh --bundle-dir $dir"
  echo "(device tool: command 'bash scripts/gpu-check.sh', carry [\"$dir\"])"
}

# bundle_programs DIR PROGRAM_PATH...: the programs into DIR/bin (stripped) and every library ldd
# lists for them that is not a system one into DIR/lib, each once (ldd lists the transitive ones
# too); those over GZIP_OVER_BYTES gzipped. Then MANIFEST, the resolution check, a start of each
# program with only the bundle's libraries, and the size limit.
bundle_programs() {
  local dir=$1
  shift
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib"
  local path prog name lib progs=()
  for path in "$@"; do
    [ -x "$path" ] || die 3 "bundle: $path is not an executable"
    prog=$(basename "$path")
    progs+=("$prog")
    cp "$path" "$dir/bin/$prog"
    strip --strip-unneeded "$dir/bin/$prog" 2>/dev/null || true
    if ldd "$path" | grep -q "not found"; then
      ldd "$path" | grep "not found"
      die 3 "$prog has unresolved libraries here"
    fi
    while read -r name lib; do
      is_system_lib "$name" && continue
      [ -e "$dir/lib/$name" ] || [ -e "$dir/lib/$name.gz" ] || cp -L "$lib" "$dir/lib/$name"
    done < <(ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  done
  local f
  for f in "$dir"/lib/*; do
    if (($(stat -c %s "$f") > GZIP_OVER_BYTES)); then gzip -6 "$f" || die 3 "bundle: gzip $f failed"; fi
  done

  local libs
  libs=$(unpack_libs "$dir") || die 3 "bundle: cannot unpack the gzipped libraries of $dir"
  local glibc
  glibc=$(objdump -T "$dir"/bin/* "$dir"/lib/*.so* "$libs"/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  {
    echo "llamatrain GPU bundle: run with scripts/gpu-check.sh from the repository root"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ local changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nvcc --version 2>/dev/null | tail -1)"
    echo "nvcc code generation: $(find "${BUILD_DIR}" -name flags.make -path '*CMakeFiles*' -exec grep -ho -- '--generate-code=[^ ]*' {} + 2>/dev/null |
      sort -u | paste -sd' ') (code=sm_XX: SASS; code=compute_XX: PTX)"
    echo "needs on the GPU machine: glibc >= ${glibc#GLIBC_}, an NVIDIA driver for CUDA 13, libcublas.so.13 + libcublasLt.so.13 (CUDA 13 toolkit), gzip"
    echo "optional there: cuDNN 9 (libcudnn.so.9) for the cuDNN attention check and benchmark rows (skipped without it)"
    echo "programs: ${progs[*]}"
    echo "carried libraries (*.gz: unpacked on the GPU machine before the run):"
    find "$dir/lib" -type f -printf "  %-32f %10s\n" | sort
    for prog in "${progs[@]}"; do
      echo "ldd bin/$prog (here, with LD_LIBRARY_PATH=lib + the unpacked libraries):"
      LD_LIBRARY_PATH="$libs:$dir/lib" ldd "$dir/bin/$prog" | sed 's/ (0x[0-9a-f]*)//; s/^\t/  /'
    done
  } >"$dir/MANIFEST"
  cat "$dir/MANIFEST"

  local ok=0
  verify_bundle "$dir" "$libs" || ok=1
  smoke_test_bundle "$dir" "$libs" || ok=1
  rm -rf "$libs"
  ((ok == 0)) || die 3 "bundle $dir does not work on its own (see above)"

  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  echo "== bundle $dir: $bytes bytes ($((bytes / 1024 / 1024)) MiB; limit 64 MiB)"
  ((bytes <= MAX_BUNDLE_BYTES)) || die 3 "bundle $dir is larger than 64 MiB ($bytes bytes)"
}

# unpack_libs BUNDLE: a new temporary directory with the bundle's gzipped libraries unpacked; prints
# its path. The others stay in BUNDLE/lib (both go on LD_LIBRARY_PATH).
unpack_libs() {
  local bundle=$1 tmp f
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/llamatrain-bundle-lib.XXXXXX") || return 1
  for f in "$bundle"/lib/*.gz; do
    [ -e "$f" ] || continue
    gzip -dc "$f" >"$tmp/$(basename "$f" .gz)" || return 1
  done
  echo "$tmp"
}

# verify_bundle DIR UNPACKED: with LD_LIBRARY_PATH = the bundle's libraries, every library of every
# program resolves either into the bundle or to a system library (is_system_lib).
verify_bundle() {
  local dir=$1 libs=$2 prog name arrow where rest bad=0 in_bundle
  local lib_abs libs_abs
  lib_abs=$(cd "$dir/lib" && pwd -P)
  libs_abs=$(cd "$libs" && pwd -P)
  for prog in "$dir"/bin/*; do
    while read -r name arrow where rest; do
      [ "$arrow" = "=>" ] || continue
      is_system_lib "$name" && continue
      in_bundle=0
      case "$(dirname "$(readlink -f "$where" 2>/dev/null || echo "$where")")" in
        "$lib_abs" | "$libs_abs") in_bundle=1 ;;
      esac
      if ((in_bundle == 0)); then
        echo "bundle check: $(basename "$prog") loads $name from $where $rest, not from the bundle" >&2
        bad=1
      fi
    done < <(LD_LIBRARY_PATH="$libs:$dir/lib" ldd "$prog")
  done
  ((bad == 0)) && echo "== bundle check: every non-system library of $(ls "$dir/bin" | paste -sd' ') resolves into $dir"
  return $bad
}

# hidden_system_run LIBPATH CMD...: runs CMD with LD_LIBRARY_PATH=LIBPATH. As root with unshare,
# in a mount namespace where the system library directory holds only the libraries is_system_lib
# names (glibc, the loader), so that a library missing from the bundle cannot be found there;
# otherwise plainly (the ldd check above still holds). Prints which of the two it did.
hidden_system_run() {
  local libpath=$1
  shift
  local sysdir
  sysdir=$(dirname "$(readlink -f "$(ldd /bin/sh | awk '$1 ~ /^libc\.so/ {print $3}')")")
  if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null && [ -d "$sysdir" ]; then
    local only f
    only=$(mktemp -d "${TMPDIR:-/tmp}/llamatrain-syslibs.XXXXXX") || return 1
    for f in "$sysdir"/*.so*; do
      is_system_lib "$(basename "$f")" && cp -L "$f" "$only/" 2>/dev/null
    done
    echo "   (system libraries hidden: $sysdir holds only $(ls "$only" | paste -sd' '))"
    unshare -m sh -c 'mount --bind "$1" "$2" || exit 125; shift 2; exec env "$@"' sh "$only" "$sysdir" \
      LD_LIBRARY_PATH="$libpath" "$@"
    local rc=$?
    rm -rf "$only"
    return $rc
  fi
  echo "   (system libraries not hidden: needs root and unshare)"
  env LD_LIBRARY_PATH="$libpath" "$@"
}

# smoke_test_bundle DIR UNPACKED: each program starts with only the bundle's libraries. Without a
# GPU, llamatrain_gpu_check must say so and exit 2; llamatrain prints its version.
smoke_test_bundle() {
  local dir=$1 libs=$2 out rc bad=0
  if [ -x "$dir/bin/llamatrain" ]; then
    echo "== bundle start: bin/llamatrain --version"
    out=$(hidden_system_run "$libs:$dir/lib" "$dir/bin/llamatrain" --version 2>&1)
    rc=$?
    echo "$out" | sed 's/^/   /'
    if ((rc != 0)); then
      echo "bundle check: bin/llamatrain --version failed (exit status $rc)" >&2
      bad=1
    fi
  fi
  if [ -x "$dir/bin/llamatrain_gpu_check" ]; then
    echo "== bundle start: bin/llamatrain_gpu_check with no device visible"
    out=$(CUDA_VISIBLE_DEVICES="" hidden_system_run "$libs:$dir/lib" "$dir/bin/llamatrain_gpu_check" 2>&1)
    rc=$?
    echo "$out" | tail -3 | sed 's/^/   /'
    if ((rc != 2)) && ((rc != 0)); then
      echo "bundle check: bin/llamatrain_gpu_check failed to start (exit status $rc)" >&2
      bad=1
    fi
  fi
  return $bad
}

# ---- GPU run -------------------------------------------------------------------------------------------

START=$SECONDS
BIN_DIR=""

# check_gpu: lists the GPUs; without one, NO_GPU says why and the status is 1.
NO_GPU=""
check_gpu() {
  if ! command -v nvidia-smi >/dev/null; then
    NO_GPU="nvidia-smi not found (no NVIDIA driver on this machine)"
    return 1
  fi
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if ((n == 0)); then
    NO_GPU="nvidia-smi lists no device"
    return 1
  fi
  echo "== GPUs"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu,memory.total \
    --format=csv 2>/dev/null || true
}

# lib_dirs GLOB [PYTHON_PACKAGE...]: the directories that hold a library matching GLOB, one search
# for every CUDA library: the toolkit's (CUDNN_HOME, CUDA_HOME, CUDA_PATH, /usr/local/cuda*,
# nvcc's), the system's (ldconfig's cache) and the lib folders of the Python packages named (the
# nvidia-* wheels PyTorch brings; older wheels: torch/lib) in the python3 on PATH and in
# $VIRTUAL_ENV's and $CONDA_PREFIX's; colon-separated, each real directory once.
lib_dirs() {
  local glob=$1
  shift
  local roots=("${CUDNN_HOME:-}" "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13)
  command -v nvcc >/dev/null && roots+=("$(dirname "$(dirname "$(command -v nvcc)")")")
  local r d py
  {
    for r in "${roots[@]}"; do
      [ -n "$r" ] || continue
      for d in "$r/lib64" "$r/lib" "$r/targets/x86_64-linux/lib"; do
        compgen -G "$d/$glob" >/dev/null && echo "$d"
      done
    done
    if command -v ldconfig >/dev/null; then
      ldconfig -p 2>/dev/null | awk '/=>/ { print $NF }' | while read -r f; do
        # shellcheck disable=SC2053
        [[ ${f##*/} == $glob ]] && echo "${f%/*}"
      done
    fi
    if (($# > 0)); then
      for py in python3 "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python3}" "${CONDA_PREFIX:+$CONDA_PREFIX/bin/python3}"; do
        if [ -z "$py" ] || ! command -v "$py" >/dev/null; then continue; fi
        "$py" - "$glob" "$@" <<'PY' 2>/dev/null
import glob, importlib.util, os, sys
pattern, packages = sys.argv[1], sys.argv[2:]
for name in packages:
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    for root in (spec.submodule_search_locations or []) if spec else []:
        d = os.path.join(root, "lib")
        if glob.glob(os.path.join(d, pattern)):
            print(d)
PY
      done
    fi
  } | while read -r d; do [ -n "$d" ] && readlink -f "$d"; done | awk '!seen[$0]++' | paste -sd:
}

# The CUDA libraries of the GPU machine: cuBLAS (linked by llamatrain_gpu_check; cuBLASLt is opened
# by llamatrain), cuDNN 9 (optional: without it the cuDNN entries say SKIP) and NCCL (multi-rank runs).
cuda_lib_dirs() { lib_dirs 'libcublas.so.13*' nvidia.cublas nvidia.cu13; }
cudnn_lib_dirs() { lib_dirs 'libcudnn.so.9*' nvidia.cudnn torch; }
nccl_lib_dirs() { lib_dirs 'libnccl.so.2*' nvidia.nccl torch; }

# probe: what the machine offers, printed and written to $RESULTS/probe.txt before any heavy work
# (a few seconds): the GPUs and the driver against CUDA 13's minimum, where each CUDA library was
# found and its version (the file the soname resolves to), host memory and cores.
probe() {
  {
    echo "== probe ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname))"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
        --format=csv 2>&1 | sed 's/^/  /'
      local driver
      driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
      if [[ $driver =~ ^([0-9]+) ]]; then
        if ((BASH_REMATCH[1] >= 580)); then
          echo "  driver $driver: CUDA 13 needs 580 or newer: ok"
        else
          echo "  driver $driver: CUDA 13 needs 580 or newer: TOO OLD (the programs will find no device)"
        fi
      fi
    else
      echo "  nvidia-smi: not found (no NVIDIA driver here)"
    fi
    local lib spec dirs d f
    for spec in "cuBLAS:libcublas.so.13*:nvidia.cublas nvidia.cu13" "cuBLASLt:libcublasLt.so.13*:nvidia.cublas nvidia.cu13" \
      "cuDNN:libcudnn.so.9*:nvidia.cudnn torch" "NCCL:libnccl.so.2*:nvidia.nccl torch"; do
      IFS=: read -r lib glob pkgs <<<"$spec"
      # shellcheck disable=SC2086
      dirs=$(lib_dirs "$glob" $pkgs)
      if [ -z "$dirs" ]; then
        echo "  $lib: not found"
        continue
      fi
      for d in ${dirs//:/ }; do
        f=$(compgen -G "$d/$glob" | head -1)
        echo "  $lib: $d ($(basename "$(readlink -f "$f")"))"
      done
    done
    awk '/^MemTotal:|^MemAvailable:/ { printf "  %s %.1f GiB\n", $1, $2 / 1048576 }' /proc/meminfo
    echo "  cores: $(env -u OMP_NUM_THREADS nproc)"
  } | tee "$RESULTS/probe.txt"
}

UNPACKED=""  # the bundle's gzipped libraries, unpacked for this run (removed at the end)
cleanup() {
  [ -z "$UNPACKED" ] || rm -rf "$UNPACKED"
  UNPACKED=""
}

find_programs() {
  local bundle=$1
  if [ -n "$BIN_DIR_ARG" ]; then
    # Programs of a build directory on this machine, with its libraries (tests: --train-device cuda-sim).
    BIN_DIR=$BIN_DIR_ARG
    [ -x "$BIN_DIR/llamatrain" ] || echo "note: no llamatrain in $BIN_DIR (the training step will fail)"
    return 0
  fi
  if [ -x "$bundle/bin/${PROGRAMS[0]}" ]; then
    BIN_DIR=$bundle/bin
    local abs cuda cudnn
    abs=$(cd "$bundle" && pwd)
    UNPACKED=$(unpack_libs "$bundle") || die 3 "cannot unpack the gzipped libraries of $bundle (needs gzip and ${TMPDIR:-/tmp})"
    cuda=$(cuda_lib_dirs)
    cudnn=$(cudnn_lib_dirs)
    export LD_LIBRARY_PATH="$UNPACKED:$abs/lib${cuda:+:$cuda}${cudnn:+:$cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuDNN directories found: ${cudnn:-none (the cuDNN attention entries will be skipped)}"
    echo "== bundle $bundle"
    head -5 "$bundle/MANIFEST" 2>/dev/null
  else
    local dir=build-gpu-native
    echo "== no bundle at $bundle: building here for the local GPU in $dir"
    mkdir -p "$dir"
    if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMATRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
      -DLLAMATRAIN_TESTS=OFF -DLLAMATRAIN_BENCHMARKS=OFF -DLLAMATRAIN_SIM_ASAN=OFF >"$dir/configure.log" 2>&1; then
      grep -m5 -iE "could not|not found|error" "$dir/configure.log"
      die 3 "no bundle and this machine cannot build llamatrain (log: $dir/configure.log): run" \
        "'scripts/gpu-check.sh --bundle' on a development machine and carry $bundle here"
    fi
    cmake --build "$dir" -j "$(nproc)" --target "${PROGRAMS[@]}" >"$dir/build.log" 2>&1 ||
      die 3 "build failed (log: $dir/build.log)"
    BIN_DIR=$dir/bin
    local cudnn
    cudnn=$(cudnn_lib_dirs)
    export LD_LIBRARY_PATH="${cudnn:+$cudnn:}${LD_LIBRARY_PATH:-}"
    mkdir -p "$BIN_DIR"
    local prog
    for prog in "${PROGRAMS[@]}"; do cp "$(find "$dir" -type f -name "$prog" -perm -u+x | head -1)" "$BIN_DIR/"; done
  fi
  local prog missing=0
  for prog in "${PROGRAMS[@]}"; do
    [ -x "$BIN_DIR/$prog" ] || { echo "$BIN_DIR/$prog: missing" && missing=1 && continue; }
    if ldd "$BIN_DIR/$prog" | grep "not found"; then missing=1; fi
  done
  ((missing == 0)) || die 3 "unresolved shared libraries (LD_LIBRARY_PATH=$LD_LIBRARY_PATH); cuBLAS comes from the" \
    "CUDA 13 toolkit (set CUDA_HOME)"
}

# run_program STEP CAP_SECONDS PROGRAM ARGS...: runs one program under `timeout`, its limit the
# smaller of CAP_SECONDS and what is left of the budget; records the step's status.
declare -A STEP_STATUS
run_program() {
  local step=$1 cap=$2 prog=$3
  shift 3
  local left=$((BUDGET - (SECONDS - START) - 5))
  local limit=$((cap < left ? cap : left))
  if ((limit < 10)); then
    echo "== $step: skipped, the time budget ($BUDGET s) is spent"
    STEP_STATUS[$step]="SKIP (the time budget is spent)"
    return 3
  fi
  echo "== $step: $prog $* (time limit $limit s)"
  # The output also goes to $RESULTS/$step.out: step_kernels reads the STICKY line there.
  timeout --kill-after=10 "$limit" "$BIN_DIR/$prog" "$@" | tee "$RESULTS/$step.out"
  local rc=${PIPESTATUS[0]}
  case $rc in
    0) STEP_STATUS[$step]="PASS" ;;
    1) STEP_STATUS[$step]="FAIL (a check failed)" ;;
    2) STEP_STATUS[$step]="SKIP (no CUDA device)" ;;
    4) STEP_STATUS[$step]="ERROR (sticky CUDA error)" ;;
    124 | 137)
      STEP_STATUS[$step]="TIMED OUT (after $limit s)"
      rc=3
      ;;
    *)
      STEP_STATUS[$step]="ERROR (exit status $rc)"
      rc=3
      ;;
  esac
  return "$rc"
}

# step_kernels: the kernel checks and benchmarks. Every check result lands in
# $RESULTS/kernel-checks.tsv and every benchmark row in $RESULTS/kernels-table.md as it is measured.
# A sticky CUDA error (exit status 4, "STICKY checks|bench FAMILY") costs that family only: the
# program starts again after it, within the step's cap, and the summary names every such family.
# KERNELS_PROGRAM=llamatrain_gpu_checks_sim runs the checks on the simulator instead (the rehearsal,
# tests/gpu/test_rehearsal.sh: no GPU, no benchmarks).
step_kernels() {
  local start=$SECONDS rc sticky=() line part family failed=0
  local args=(--table "$RESULTS/kernels-table.md" --results "$RESULTS/kernel-checks.tsv")
  rm -f "$RESULTS/kernels-table.md" "$RESULTS/kernel-checks.tsv"
  while :; do
    run_program kernels $((KERNELS_CAP - (SECONDS - start))) "$KERNELS_PROGRAM" "${args[@]}"
    rc=$?
    ((rc == 4)) || break
    line=$(grep -m1 '^llamatrain_gpu_check: STICKY ' "$RESULTS/kernels.out")
    read -r _ _ part family _ <<<"$line"
    family=${family%:}
    [ -n "$family" ] || break
    sticky+=("$part $family")
    echo "== kernels: a sticky CUDA error in $part $family; starting again after it"
    if [ "$part" = checks ]; then
      args=(--table "$RESULTS/kernels-table.md" --results "$RESULTS/kernel-checks.tsv" --after "$family")
    else
      args=(--bench-only --table "$RESULTS/kernels-table.md" --bench-after "$family")
    fi
  done
  [ -f "$RESULTS/kernel-checks.tsv" ] && failed=$(grep -c '^FAIL' "$RESULTS/kernel-checks.tsv")
  if ((${#sticky[@]} > 0)); then
    local names
    names=$(printf '%s, ' "${sticky[@]}")
    STEP_STATUS[kernels]="ERROR (sticky CUDA error in ${names%, }; $failed check(s) FAILED; last start: ${STEP_STATUS[kernels]})"
    return 3
  fi
  return $((rc == 0 ? 0 : rc == 1 ? 1 : 3))
}

# ---- the sharded stages' check ---------------------------------------------------------------------

# step_zero: ZeRO 1, 2, 3 and 3 with --offload-optimizer on one device, the same job (TRAIN_MODEL
# shapes with ZERO_LAYERS layers, 2 micro-batches of 1 x min(TRAIN_SEQ_LEN, 512) tokens per step,
# ZERO_STEPS steps, seed 7): every run's losses equal ZeRO 1's bit for bit (one rank: the stages
# and the host's AdamW round the same operations the same way; the H200 run of 2026-12-04 measured
# 0 for all four), its device peak
# within 10% of its memory table, and the offloaded run's peak below ZeRO 3's (no optimizer state
# on the device). Then LoRA rank 16 (issue 36) at ZeRO 1 and 3 on the same random base: ZeRO 3's
# losses equal ZeRO 1's, each peak within 10% of its table, and below full fine-tuning's. One rank, so the gathers and reductions stay local; their collectives are
# checked on cuda-sim under MPI (CudaSimTraining tests). Table: $RESULTS/zero-table.md.
zero_left() {
  local by_cap=$((ZERO_CAP - (SECONDS - ZERO_START))) by_budget=$((BUDGET - (SECONDS - START) - 5))
  echo $((by_cap < by_budget ? by_cap : by_budget))
}

step_zero() {
  ZERO_START=$SECONDS
  local dir=$RESULTS/zero seq=$((TRAIN_SEQ_LEN < 512 ? TRAIN_SEQ_LEN : 512))
  mkdir -p "$dir"
  echo "== zero: ZeRO 1, 2, 3, 3 with the optimizer offloaded, LoRA at 1 and 3, $TRAIN_MODEL shapes with $ZERO_LAYERS layers," \
    "one $TRAIN_DEVICE device (time limit $(zero_left) s)"
  STEP_STATUS[zero]="FAIL (see above)"
  command -v python3 >/dev/null || { STEP_STATUS[zero]="ERROR (needs python3 to read metrics)" && return 3; }
  if (($(zero_left) < 20)); then
    STEP_STATUS[zero]="SKIP (the time budget is spent)"
    return 3
  fi
  run_logged zero "$(zero_left)" "$dir/prepare.log" llamatrain prepare --text builtin:tinytales --seq-len "$seq" \
    --vocab-size 512 --test-split 0 --output "$dir/data.h5" || return 3
  local run
  for run in z1:1 z2:2 z3:3 z3off:3:--offload-optimizer lora1:1:--lora-rank=16 lora3:3:--lora-rank=16; do
    IFS=: read -r name stage extra <<<"$run"
    local args=(train --device "$TRAIN_DEVICE" --model-config "$TRAIN_MODEL" --n-layers "$ZERO_LAYERS"
      --data "$dir/data.h5" --batch-size 1 --global-batch 2 --max-steps "$ZERO_STEPS" --lr 1e-4 --warmup-steps 0
      --seed 7 --no-progress --zero "$stage" --metrics "$dir/$name.jsonl")
    if [ -n "$extra" ]; then  # an option, or OPTION=VALUE: two arguments
      local more
      IFS== read -r -a more <<<"$extra"
      args+=("${more[@]}")
    fi
    echo "   llamatrain ${args[*]}"
    rm -f "$dir/$name.jsonl"
    run_logged zero "$(zero_left)" "$dir/$name.log" llamatrain "${args[@]}" || return 3
  done
  if python3 - "$dir" >"$RESULTS/zero-table.md" <<'PY'; then
import json, statistics, sys
d = sys.argv[1]
def records(name, kind):
    return [r for r in map(json.loads, open(f"{d}/{name}.jsonl")) if r.get("type") == kind]
# (name, stage, option, the run whose losses it must equal)
runs = [("z1", "1", "", "z1"), ("z2", "2", "", "z1"), ("z3", "3", "", "z1"), ("z3off", "3", "--offload-optimizer", "z1"),
        ("lora1", "1", "--lora-rank 16", "lora1"), ("lora3", "3", "--lora-rank 16", "lora1")]
print("| ZeRO | option | losses, first and last | worst vs ZeRO 1 | tokens/s | device peak | table | peak / table |")
print("|---|---|---|---|---|---|---|---|")
ok, peaks = True, {}
for name, stage, opt, same_as in runs:
    ref = [s["loss"] for s in records(same_as, "step")]
    steps = records(name, "step")
    losses = [s["loss"] for s in steps]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref)) if len(losses) == len(ref) else float("inf")
    peak = max(s["device_peak_bytes"] for s in steps)
    table = records(name, "memory")[0]["ranks"][0]["total_bytes"]
    tok = statistics.median(s["tokens_per_s"] for s in steps[2:] or steps)
    peaks[name] = peak
    ok &= worst == 0 and 0.9 <= peak / table <= 1.1
    print(f"| {stage} | {opt or '-'} | {losses[0]:.6f}, {losses[-1]:.6f} | {worst:.2e} | {tok:.0f} | "
          f"{peak / 2**20:.1f} MiB | {table / 2**20:.1f} MiB | {peak / table:.4f} |")
ok &= peaks["z3off"] < peaks["z3"] and peaks["lora1"] < peaks["z1"]
print(f"\nchecks: losses equal to ZeRO 1's (LoRA's to LoRA at ZeRO 1's), peak within 10% of the table, offloaded "
      f"peak below ZeRO 3's, LoRA's below full fine-tuning's: {'passed' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
    cat "$RESULTS/zero-table.md"
    STEP_STATUS[zero]="PASS"
    return 0
  fi
  cat "$RESULTS/zero-table.md"
  STEP_STATUS[zero]="FAIL (a check failed: see the table; logs in $dir)"
  return 1
}

# ---- the training step ----------------------------------------------------------------------------

# run_logged STEP LIMIT LOG PROGRAM ARGS...: PROGRAM under `timeout` LIMIT seconds, its output in LOG;
# on failure the command, its exit status and the log's tail are shown, and the step's status says
# what failed (TIMED OUT when the limit ended it or left no time to start it; in a $(...) the
# caller sets it). Returns the exit status.
run_logged() {
  local step=$1 limit=$2 log=$3 prog=$4
  shift 4
  local what="$prog $1${2:+ $2}"
  # Messages go to stderr: callers capture stdout (the planner's numbers).
  if ((limit < 5)); then
    echo "   $step: no time left for $prog $1" >&2
    STEP_STATUS[$step]="TIMED OUT (no time left to start $what: the step's cap or the budget is spent)"
    return 124
  fi
  timeout --kill-after=10 "$limit" "$BIN_DIR/$prog" "$@" >"$log" 2>&1
  local rc=$?
  if ((rc != 0)); then
    {
      echo "   $step: FAILED: $prog $* (exit status $rc$( ((rc == 124 || rc == 137)) && echo ", timed out after $limit s"))"
      echo "   last lines of $log:"
      tail -n 25 "$log" | sed 's/^/     | /'
    } >&2
    if ((rc == 124 || rc == 137)); then
      STEP_STATUS[$step]="TIMED OUT ($what after $limit s, the rest of the step's cap; log $log)"
    else
      STEP_STATUS[$step]="FAIL ($what exited $rc; log $log)"
    fi
  fi
  return $rc
}

# Seconds left for the training step: its cap from its start, within the whole run's budget.
train_left() {
  local by_cap=$((TRAIN_CAP - (SECONDS - TRAIN_START)))
  local by_budget=$((BUDGET - (SECONDS - START) - 5))
  echo $((by_cap < by_budget ? by_cap : by_budget))
}

# plan_memory LAYERS RECOMPUTE: the planner's memory of one rank training TRAIN_MODEL with LAYERS
# layers, one sequence of TRAIN_SEQ_LEN per micro-batch, on one GPU; prints
# "total_bytes n_params params grads optimizer activations usable_fraction".
plan_memory() {
  local layers=$1 recompute=$2 json=$TRAIN_DIR/plan-$1-$2.json unfit=()
  # A plan that does not fit exits 1 unless --allow-unfit (which older builds lack): here the
  # memory is wanted either way (the device's real capacity replaces the hostfile's).
  "$BIN_DIR/llamatrain" plan --help 2>&1 | grep -q -- --allow-unfit && unfit=(--allow-unfit)
  run_logged train "$(train_left)" "$json" llamatrain plan --hostfile "$TRAIN_DIR/hostfile" \
    --model-config "$TRAIN_MODEL" --n-layers "$layers" --seq-len "$TRAIN_SEQ_LEN" --global-batch 1 \
    --batch-size 1 --tokens "$((TRAIN_SEQ_LEN * 64))" --zero 1 --recompute "$recompute" --json "${unfit[@]}" \
    >/dev/null || return 1
  python3 - "$json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m = d["ranks"][0]["memory"]
print(int(m["total_bytes"]), d["n_params"], int(m["params_bytes"]), int(m["grads_bytes"]),
      int(m["optimizer_bytes"]), int(m["activation_bytes"]), d["constants"]["constants"]["gpu_memory_usable"])
PY
}

# fits LAYERS RECOMPUTE: the planner's total plus TRAIN_MARGIN fits the device's usable memory (its
# memory times the planner's gpu_memory_usable), and the host can hold what the trainer keeps there
# besides: fp32 weights and Adam m, v as the staging area of checkpoints (12 bytes per parameter;
# 14 counted for the transient bf16 copy on the way to the device).
fits() {
  local p
  p=$(plan_memory "$1" "$2") || return 2
  read -r total n_params _ _ _ _ usable <<<"$p"
  python3 -c "import sys; sys.exit(0 if $total + $TRAIN_MARGIN <= $TRAIN_MEMORY_BYTES * $usable and 14 * $n_params <= 0.95 * $TRAIN_HOST_BYTES else 1)"
}

# largest_fit RECOMPUTE: the most layers (1..L) that fit, 0 if none; binary search over the planner.
largest_fit() {
  local recompute=$1 lo=0 hi=$MODEL_LAYERS mid rc
  while ((lo < hi)); do
    mid=$(((lo + hi + 1) / 2))
    fits "$mid" "$recompute"
    rc=$?
    ((rc == 2)) && return 1
    if ((rc == 0)); then lo=$mid; else hi=$((mid - 1)); fi
  done
  echo "$lo"
}

step_train() {
  TRAIN_START=$SECONDS
  TRAIN_DIR=$RESULTS/train
  mkdir -p "$TRAIN_DIR"
  echo "== train: $TRAIN_MODEL layer shapes at sequence $TRAIN_SEQ_LEN on one $TRAIN_DEVICE device" \
    "(time limit $(train_left) s: data, plan, $TRAIN_STEPS steps)"
  STEP_STATUS[train]="FAIL (see above)"
  if (($(train_left) < 30)); then
    echo "== train: skipped, the time budget ($BUDGET s) is spent"
    STEP_STATUS[train]="SKIP (the time budget is spent)"
    return 3
  fi
  command -v python3 >/dev/null || { STEP_STATUS[train]="ERROR (needs python3 to read plans and metrics)" && return 3; }
  [ -x "$BIN_DIR/llamatrain" ] || { STEP_STATUS[train]="ERROR (no llamatrain in $BIN_DIR)" && return 3; }

  # Device memory: the GPU's (the one a one-rank run uses) unless given.
  if [ -z "$TRAIN_MEMORY_BYTES" ]; then
    if [ "$TRAIN_DEVICE" = cuda ]; then
      local idx=${CUDA_VISIBLE_DEVICES:-0} mib
      mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "${idx%%,*}" 2>/dev/null | head -1)
      [[ $mib =~ ^[0-9]+$ ]] || { STEP_STATUS[train]="ERROR (nvidia-smi gave no memory.total)" && return 3; }
      TRAIN_MEMORY_BYTES=$((mib * 1024 * 1024))
    else
      TRAIN_MEMORY_BYTES=$(awk '/^MemTotal:/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
    fi
  fi
  [ -n "$TRAIN_HOST_BYTES" ] || TRAIN_HOST_BYTES=$(awk '/^MemTotal:/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
  # What the planner does not count (fragmentation, the library workspaces' growth): 2 GiB or 3%
  # of the device, the larger, kept free when the planner chooses the layers.
  TRAIN_MARGIN=$((2 * 1024 * 1024 * 1024))
  ((TRAIN_MEMORY_BYTES * 3 / 100 > TRAIN_MARGIN)) && TRAIN_MARGIN=$((TRAIN_MEMORY_BYTES * 3 / 100))
  # The planner's memory per rank depends on the GPU type only through its capacity, which is
  # replaced here by the measured one; any GPU type of its table will do.
  echo "localhost slots=1   # gpu=H100-SXM5-80GB" >"$TRAIN_DIR/hostfile"

  local train_help
  train_help=$("$BIN_DIR/llamatrain" train --help 2>&1)
  local have_recompute=0
  grep -q -- "--recompute" <<<"$train_help" && have_recompute=1
  MODEL_LAYERS=$(model_layers "$TRAIN_MODEL")
  ((MODEL_LAYERS > 0)) || { STEP_STATUS[train]="ERROR (unknown model $TRAIN_MODEL)" && return 3; }

  # Layers and recomputation: the planner's largest K for each mode train offers, cheapest first.
  local k=0 recompute=none why r kr
  local modes=(none)
  ((have_recompute)) && modes=(none attn full)
  [ -n "$TRAIN_RECOMPUTE" ] && modes=("$TRAIN_RECOMPUTE")
  if [ -n "$TRAIN_LAYERS" ]; then
    k=$TRAIN_LAYERS recompute=${modes[0]} why="given with --train-layers"
  else
    for r in "${modes[@]}"; do
      kr=$(largest_fit "$r") || { STEP_STATUS[train]="ERROR (llamatrain plan failed)" && return 3; }
      echo "   planner: $kr of $MODEL_LAYERS layers fit with --recompute $r"
      if ((kr > k)); then k=$kr recompute=$r; fi
      ((k == MODEL_LAYERS)) && break
    done
    if ((k == 0)); then
      STEP_STATUS[train]="FAIL (not even one layer fits $TRAIN_MEMORY_BYTES bytes by the planner)"
      return 1
    fi
    if ((k == MODEL_LAYERS)); then
      why="all $MODEL_LAYERS layers fit by the planner"
    else
      why="the full model does not fit by the planner (or the host lacks memory for its fp32 state); the most layers that do"
    fi
  fi
  ((have_recompute)) || echo "   (this llamatrain train has no --recompute option: the plan assumes none, nothing is passed)"
  echo "   layers: $k of $MODEL_LAYERS ($why), recompute $recompute, device memory $TRAIN_MEMORY_BYTES bytes" \
    "(margin $TRAIN_MARGIN kept free), host memory $TRAIN_HOST_BYTES bytes"

  # Data: the embedded story corpus with a small tokenizer (the model keeps its vocabulary), enough
  # sequences for every step without an epoch end (no test split, so no evaluation pass).
  local data=$TRAIN_DIR/data.h5
  run_logged train "$(train_left)" "$TRAIN_DIR/prepare.log" llamatrain prepare --text builtin:tinytales \
    --seq-len "$TRAIN_SEQ_LEN" --vocab-size 512 --test-split 0 --output "$data" || return 3

  local attempt
  for attempt in 1 2; do
    local metrics=$TRAIN_DIR/metrics-$k.jsonl log=$TRAIN_DIR/train-$k.log
    local args=(train --device "$TRAIN_DEVICE" --model-config "$TRAIN_MODEL" --n-layers "$k" --data "$data"
      --batch-size 1 --global-batch "$TRAIN_MICRO_BATCHES" --max-steps "$TRAIN_STEPS" --lr 1e-5 --warmup-steps 0 --no-progress --metrics "$metrics")
    ((have_recompute)) && args+=(--recompute "$recompute")
    [ "$TRAIN_ATTENTION" = native ] || args+=(--attention "$TRAIN_ATTENTION")
    rm -f "$metrics"
    echo "   llamatrain ${args[*]}"
    if run_logged train "$(train_left)" "$log" llamatrain "${args[@]}"; then
      train_report "$metrics" "$k" "$recompute" "$why" && STEP_STATUS[train]="PASS" && return 0
      STEP_STATUS[train]="FAIL (could not read $metrics)"
      return 1
    fi
    # Out of device memory: the planner's prediction was too low. Once, if time allows, fewer layers.
    if ((attempt == 1)) && [ -z "$TRAIN_LAYERS" ] && grep -q "cannot allocate" "$log" && (($(train_left) > 60)) && ((k > 1)); then
      k=$((k * 3 / 4))
      why="$why, but that ran out of device memory (see above): retried with 3/4 of them"
      echo "   out of device memory: retrying with $k layers"
      continue
    fi
    break
  done
  return 3  # run_logged said why in the step's status
}

# train_report METRICS LAYERS RECOMPUTE WHY: the table of the training step from train's metrics
# (tokens/s and MFU: medians over the steps after the first two, which carry cuBLASLt's and the
# allocator's warm-up; peak device memory: the largest device_peak_bytes) and the planner's
# prediction for the same run; printed and written to $RESULTS/train-table.md.
train_report() {
  local metrics=$1 layers=$2 recompute=$3 why=$4 p
  p=$(plan_memory "$layers" "$recompute") || return 1
  # $p: the planner's seven numbers, one argument each.
  # shellcheck disable=SC2086
  LT_MICRO_BATCHES=$TRAIN_MICRO_BATCHES LT_ATTENTION=$TRAIN_ATTENTION python3 - "$metrics" "$TRAIN_MODEL" "$layers" "$MODEL_LAYERS" "$TRAIN_SEQ_LEN" "$recompute" "$why" \
    "$TRAIN_MEMORY_BYTES" "$TRAIN_DEVICE" $p >"$RESULTS/train-table.md" <<'PY' || return 1
import json, os, statistics, sys
(path, model, layers, model_layers, seq, recompute, why, capacity, device, total, n_params, params, grads, optimizer,
 activations, usable) = sys.argv[1:]
recs = [json.loads(line) for line in open(path) if line.strip()]
steps = [r for r in recs if r.get("type") == "step"]
dev = next((r for r in recs if r.get("type") == "devices"), None)
if not steps or dev is None:
    sys.exit(f"{path}: no step or devices records")
timed = steps[2:] if len(steps) > 2 else steps
tok_s = statistics.median(r["tokens_per_s"] for r in timed)
step_ms = statistics.median(r["step_ms"] for r in timed)
opt_ms = statistics.median(r["optimizer_ms"] for r in timed) if all("optimizer_ms" in r for r in timed) else None
# rank_mfu is against the datasheet dense bf16 peak (null for a GPU not in the table).
mfu = statistics.median((r["rank_mfu"][0] if r["rank_mfu"][0] is not None else float("nan")) for r in timed)
mfu_gemm = statistics.median(r["mfu_vs_measured_gemm"][0] for r in timed)
peak = max(r.get("device_peak_bytes", 0) for r in steps)
driver = max(r.get("device_driver_used_peak_bytes", 0) for r in steps)
rank0 = dev["ranks"][0]
tflops = lambda x: f"{x:.1f}" if x >= 1 else f"{x:.3g}"
def gib(b):
    b = float(b)
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"
total = float(total)
rows = [
    ("device", f"{rank0['device']} ({device}), {gib(rank0['memory_bytes'])}"),
    ("model", f"{model} layer shapes, {layers} of {model_layers} layers ({why}); " +
              (f"{int(n_params) / 1e9:.3f}B" if int(n_params) >= 1e9 else f"{int(n_params) / 1e6:.3f}M") + " parameters"),
    ("run", f"global batch of {os.environ.get('LT_MICRO_BATCHES', '?')} micro-batches of 1 x sequence {seq}, "
            f"recompute {recompute}, {os.environ.get('LT_ATTENTION', 'native')} attention, {len(steps)} steps "
            f"(medians over the {len(timed)} after the first two)"),
    ("tokens/s", f"{tok_s:.0f} (step {step_ms:.1f} ms; first step {steps[0]['step_ms']:.0f} ms)"),
    ("optimizer share", f"{100 * opt_ms / step_ms:.1f}% of the step ({opt_ms:.1f} ms: gradient reduction, clipping "
                        f"and AdamW after the passes, once per global batch)" if opt_ms is not None else
                        "not reported by this llamatrain (no optimizer_ms)"),
    ("MFU", f"{100 * mfu:.1f}% of the dense peak ({tflops(rank0['peak_tflops'])} TFLOP/s, {dev['peak']}); "
            f"{100 * mfu_gemm:.1f}% of the measured GEMM rate ({tflops(rank0['gemm_tflops'])} TFLOP/s, {dev['gemm']}); "
            f"6N + 12LCT FLOPs per token"),
    ("peak device memory", f"{gib(peak)} through the backend's allocator"
                           + (f"; driver-reported peak {gib(driver)} (context and libraries included)" if driver else "")),
    ("planner's prediction", f"{gib(total)} (params {gib(params)}, grads {gib(grads)}, optimizer {gib(optimizer)}, "
                             f"activations {gib(activations)}); usable {gib(float(capacity) * float(usable))}"),
    ("measured / predicted", f"{peak / total:.3f}" if total > 0 else "n/a"),
]
# What the device runtime did in the last step (docs/usage.md, device_calls): 0 allocations, frees,
# device-wide synchronisations and cuBLASLt plans built once warm.
calls = steps[-1].get("device_calls")
if calls:
    rows.append(("host stalls, last step (rank 0)", ", ".join(f"{k} {v[0]}" for k, v in calls.items())))
print("| training | |")
print("|---|---|")
for k, v in rows:
    print(f"| {k} | {v} |")
PY
  cat "$RESULTS/train-table.md"
}

# model_layers NAME: the preset's number of layers (from the planner's JSON).
model_layers() {
  "$BIN_DIR/llamatrain" plan --model-config "$1" --seq-len 8 --global-batch 1 --tokens 8 --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["n_layers"])' 2>/dev/null || echo 0
}

gpu_run() {
  local bundle=$1
  # gpu_run is the left side of a pipeline (| tee): a subshell, whose EXIT trap is its own.
  trap cleanup EXIT
  probe
  # The simulator's training step (tests) needs no GPU; everything else does.
  local steps=" ${STEPS[*]} " step
  if [[ $steps == *" kernels "* && $KERNELS_PROGRAM != *_sim ]] ||
    [[ $TRAIN_DEVICE == cuda && ($steps == *" zero "* || $steps == *" train "*) ]]; then
    if ! check_gpu; then
      echo "gpu-check: no GPU: $NO_GPU; nothing was run"
      for step in "${STEPS[@]}"; do STEP_STATUS[$step]="SKIP (no CUDA device: $NO_GPU)"; done
      print_summary
      return 2
    fi
  fi
  find_programs "$bundle"
  local worst=0 rc t0
  for step in "${STEPS[@]}"; do
    t0=$SECONDS
    "step_$step"
    rc=$?
    STEP_SECONDS[$step]=$((SECONDS - t0))
    ((rc > worst)) && worst=$rc
  done
  cleanup
  print_summary
  return $worst
}

# print_summary: the run's last lines, also $RESULTS/summary.md (measured_summary).
print_summary() {
  echo
  echo "== gpu-check summary ($((SECONDS - START)) s of $BUDGET s; every table and log in $RESULTS)"
  measured_summary | tee "$RESULTS/summary.md"
}

# md_cell FILE KERNEL SHAPE_PART CELL: cell number CELL (1: the first) of the Markdown table row
# whose first cell is KERNEL and second contains SHAPE_PART (the first such row); empty if none.
md_cell() {
  [ -f "$1" ] || return 0
  awk -F' *[|] *' -v k="$2" -v sh="$3" -v c="$4" '$2 == k && index($3, sh) { print $(c + 1); exit }' "$1"
}

# measured_summary: the run's last lines, one table (also $RESULTS/summary.md): each step's result
# (PASS, FAIL, SKIP, TIMED OUT or ERROR, with why) and seconds, then the headline numbers read from
# the steps' tables: attention TFLOP/s forward and backward at each benchmarked T with its % of the
# measured cuBLAS GEMM rate and of the datasheet's dense peak, cuDNN's beside it; the GEMM rate,
# training tokens/s, MFU and the device peak against the planner. A row whose step did not measure
# it says so.
declare -A STEP_SECONDS
measured_summary() {
  local k=$RESULTS/kernels-table.md t=$RESULTS/train-table.md T dir ours pct peak cudnn v step
  echo
  echo "| gpu-check | ours | cuDNN |"
  echo "|---|---|---|"
  for step in "${STEPS[@]}"; do
    echo "| step $step (${STEP_SECONDS[$step]:-0} s) | ${STEP_STATUS[$step]:-not run} | |"
  done
  for T in 512 2048 4096; do
    for dir in forward backward; do
      ours=$(md_cell "$k" "attention_$dir" "T=$T " 6)
      pct=$(md_cell "$k" "attention_$dir" "T=$T " 7)
      peak=$(md_cell "$k" "attention_$dir" "T=$T " 8)
      [ "$peak" = - ] && peak=""
      cudnn=$(md_cell "$k" "cudnn_sdpa_$dir" "T=$T " 6)
      echo "| attention $dir T=$T (TFLOP/s) | ${ours:-not measured}${pct:+ ($pct% of GEMM${peak:+, $peak% of dense peak})} |" \
        "${cudnn:-not measured} |"
    done
  done
  v=$(md_cell "$k" "cuBLAS GEMM bf16" "" 6)
  echo "| cuBLAS bf16 GEMM (TFLOP/s) | ${v:-not measured} | |"
  v=$(md_cell "$t" "tokens/s" "" 2)
  echo "| training tokens/s | ${v:-not measured} | |"
  v=$(md_cell "$t" "MFU" "" 2)
  echo "| training MFU | ${v:-not measured} | |"
  v=$(md_cell "$t" "optimizer share" "" 2)
  echo "| optimizer share of a training step | ${v:-not measured} | |"
  v=$(md_cell "$t" "measured / predicted" "" 2)
  echo "| device peak / planner's prediction | ${v:-not measured} | |"
}

# ---- main ----------------------------------------------------------------------------------------------
# PATH relative to the directory the script was started from, made absolute.
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

main() {
  mode=run
  COLLECT=()
  # need N OPTION ARGS...: OPTION has at least N values after it.
  need() { (($3 > $1)) || die 64 "$2 needs a value (see --help)"; }
  while (($# > 0)); do
    case "$1" in
      --bundle)
        mode=bundle
        if (($# > 1)) && [[ $2 != -* ]]; then BUNDLE_DIR=$2 && shift; fi
        ;;
      --collect)
        need 2 "$1" $#
        mode=collect
        BUNDLE_DIR=$(absolute "$2")
        shift 2
        local a
        for a in "$@"; do COLLECT+=("$(absolute "$a")"); done
        ((${#COLLECT[@]} > 0)) || die 64 "--collect DIR needs programs"
        set --
        continue
        ;;
      --steps)
        need 1 "$1" $#
        IFS=, read -r -a STEPS <<<"$2"
        for step in "${STEPS[@]}"; do
          declare -F "step_$step" >/dev/null || die 64 "--steps: unknown step '$step' (kernels, zero, train)"
        done
        shift
        ;;
      --bin-dir) need 1 "$1" $# && BIN_DIR_ARG=$(absolute "$2") && shift ;;
      --train-device)
        need 1 "$1" $#
        [[ $2 == cuda || $2 == cuda-sim ]] || die 64 "--train-device: cuda or cuda-sim, not '$2'"
        TRAIN_DEVICE=$2 && shift
        ;;
      --train-model) need 1 "$1" $# && TRAIN_MODEL=$2 && shift ;;
      --train-seq-len) need 1 "$1" $# && TRAIN_SEQ_LEN=$2 && shift ;;
      --train-steps) need 1 "$1" $# && TRAIN_STEPS=$2 && shift ;;
      --train-micro-batches)
        need 1 "$1" $#
        [[ $2 =~ ^[1-9][0-9]*$ ]] || die 64 "--train-micro-batches: a positive number, not '$2'"
        TRAIN_MICRO_BATCHES=$2 && shift
        ;;
      --train-layers)
        need 1 "$1" $#
        [[ $2 =~ ^[1-9][0-9]*$ ]] || die 64 "--train-layers: a positive number of layers, not '$2'"
        TRAIN_LAYERS=$2 && shift
        ;;
      --train-recompute) need 1 "$1" $# && TRAIN_RECOMPUTE=$2 && shift ;;
      --train-attention)
        need 1 "$1" $#
        [[ $2 == native || $2 == cudnn ]] || die 64 "--train-attention: native or cudnn, not '$2'"
        TRAIN_ATTENTION=$2 && shift
        ;;
      --train-memory-bytes) need 1 "$1" $# && TRAIN_MEMORY_BYTES=$2 && shift ;;
      --train-host-bytes) need 1 "$1" $# && TRAIN_HOST_BYTES=$2 && shift ;;
      --bundle-dir)
        (($# > 1)) || die 64 "--bundle-dir needs a directory"
        BUNDLE_DIR=$2 && shift
        ;;
      --budget)
        (($# > 1)) || die 64 "--budget needs seconds"
        BUDGET=$2 && shift
        ;;
      -h | --help) usage && exit 0 ;;
      *) die 64 "unknown argument '$1' (see --help)" ;;
    esac
    shift
  done
  BUNDLE_DIR=${BUNDLE_DIR%/}
  # --bundle DIR and --bundle-dir DIR are relative to the repository root; --collect and --bin-dir
  # paths were made absolute above.
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 3

  if [ "$mode" = bundle ]; then
    make_bundle "$BUNDLE_DIR"
    return $?
  fi
  if [ "$mode" = collect ]; then
    bundle_programs "$BUNDLE_DIR" "${COLLECT[@]}"
    return $?
  fi

  if [ -n "${OUT:-}" ]; then
    RESULTS=$OUT/gpu-check
  else
    RESULTS=build-gpu/results/$(date -u +%Y%m%dT%H%M%SZ)
  fi
  mkdir -p "$RESULTS" || die 3 "cannot create $RESULTS"
  gpu_run "$BUNDLE_DIR" 2>&1 | tee "$RESULTS/gpu-check.log"
  return "${PIPESTATUS[0]}"
}

# Sourced (the tests call its functions), the script only defines them.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
  exit $?
fi
