#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (DESIGN.md, "Testing without a GPU", point 3): the kernel tests
# on the device against the CPU backend, then kernel benchmarks on Llama-2-7b shapes with a table of
# time, GB/s (against the measured device-to-device copy bandwidth) and TFLOP/s (attention, against
# the measured cuBLAS bf16 GEMM rate). The whole GPU run stays under 8 minutes.
#
#   scripts/gpu-check.sh --bundle [DIR]
#       On the development machine (no GPU needed): build the device programs (sm_80 + sm_90 SASS,
#       PTX for forward compatibility) in ${GPU_BUILD_DIR:-build-gpu}, copy them with the non-system
#       shared libraries ldd lists (OpenBLAS, libgfortran, libgomp, libstdc++, ...) into DIR
#       (default build-gpu/bundle, git-ignored), write DIR/MANIFEST; fails if DIR exceeds 64 MiB.
#       The CUDA libraries (cuBLAS, cuBLASLt) are not carried: the GPU machine has the toolkit;
#       cudart is linked statically. cuDNN (for the cuDNN attention check and benchmark rows) is not
#       carried either: it is opened with dlopen and looked for on the GPU machine (cudnn_lib_dirs).
#   scripts/gpu-check.sh [--bundle-dir DIR] [--budget SECONDS]
#       On the GPU machine, from the repository root: run the bundle in DIR (default build-gpu/bundle);
#       without one, build here for the local GPU (CMAKE_CUDA_ARCHITECTURES=native) if this machine
#       has our packages. Output goes to the terminal and to $OUT/gpu-check/ when OUT is set
#       (otherwise build-gpu/results/<time>/): gpu-check.log and kernels-table.md.
#
# Exit status: 0 every step passed; 1 a check failed; 2 no GPU here (nothing was run);
# 3 could not build or run (missing libraries, CUDA error, time budget exceeded); 64 bad usage.
#
# Adding a step (issue 7: the one-GPU training benchmark): build its program in the bundle (append
# it to PROGRAMS), write a step_<name> function that calls run_program, and append <name> to STEPS.

# step_<name> functions are called through "step_$step":
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3

BUILD_DIR=${GPU_BUILD_DIR:-build-gpu}
BUNDLE_DIR=build-gpu/bundle
JOBS=${JOBS:-2}
BUDGET=${GPU_CHECK_BUDGET:-450}   # seconds for the whole GPU run (the issue asks for < 8 minutes)
MAX_BUNDLE_BYTES=$((64 * 1024 * 1024))
PROGRAMS=(llamatrain_gpu_check)   # the device programs the bundle carries
STEPS=(kernels)                   # the steps of a GPU run, in order

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

  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib"
  local prog path name lib
  for prog in "${PROGRAMS[@]}"; do
    path=$(find "$BUILD_DIR" -type f -name "$prog" -perm -u+x | head -1)
    [ -n "$path" ] || die 3 "built $prog but cannot find it under $BUILD_DIR"
    cp "$path" "$dir/bin/$prog"
    strip --strip-unneeded "$dir/bin/$prog" 2>/dev/null || true
    # name => /path for every resolved dependency (transitive ones included: ldd lists them all).
    while read -r name lib; do
      is_system_lib "$name" && continue
      [ -e "$dir/lib/$name" ] || cp -L "$lib" "$dir/lib/$name"
    done < <(ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
    if ldd "$path" | grep -q "not found"; then
      ldd "$path" | grep "not found"
      die 3 "$prog has unresolved libraries here"
    fi
  done

  local glibc
  glibc=$(objdump -T "$dir"/bin/* "$dir"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  {
    echo "llamatrain GPU bundle: run with scripts/gpu-check.sh from the repository root"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ local changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nvcc --version 2>/dev/null | tail -1)"
    echo "nvcc code generation: $(find "$BUILD_DIR" -name flags.make -path '*CMakeFiles*' -exec grep -ho -- '--generate-code=[^ ]*' {} + |
      sort -u | paste -sd' ') (code=sm_XX: SASS; code=compute_XX: PTX)"
    echo "needs on the GPU machine: glibc >= ${glibc#GLIBC_}, an NVIDIA driver for CUDA 13, libcublas.so.13 + libcublasLt.so.13 (CUDA 13 toolkit)"
    echo "optional there: cuDNN 9 (libcudnn.so.9) for the cuDNN attention check and benchmark rows (skipped without it)"
    echo "programs: ${PROGRAMS[*]}"
    echo "carried libraries:"
    find "$dir/lib" -type f -printf "  %-28f %10s\n" | sort
    for prog in "${PROGRAMS[@]}"; do
      echo "ldd bin/$prog (here, with LD_LIBRARY_PATH=lib):"
      LD_LIBRARY_PATH="$dir/lib" ldd "$dir/bin/$prog" | sed 's/ (0x[0-9a-f]*)//; s/^\t/  /'
    done
  } >"$dir/MANIFEST"

  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  cat "$dir/MANIFEST"
  echo "== bundle $dir: $bytes bytes ($((bytes / 1024 / 1024)) MiB; limit 64 MiB)"
  ((bytes <= MAX_BUNDLE_BYTES)) || die 3 "bundle $dir is larger than 64 MiB"
  echo "run it on the GPU machine from the repository root: bash scripts/gpu-check.sh --bundle-dir $dir"
  echo "(device tool: command 'bash scripts/gpu-check.sh', carry [\"$dir\"])"
}

# ---- GPU run -------------------------------------------------------------------------------------------

START=$SECONDS
BIN_DIR=""

check_gpu() {
  command -v nvidia-smi >/dev/null ||
    die 2 "no GPU: nvidia-smi not found (no NVIDIA driver on this machine); nothing was run"
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  ((n > 0)) || die 2 "no GPU: nvidia-smi lists no device; nothing was run"
  echo "== GPUs"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu,memory.total \
    --format=csv 2>/dev/null || true
}

# The CUDA toolkit's libraries (cuBLAS) on the GPU machine.
cuda_lib_dirs() {
  local roots=("${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13)
  command -v nvcc >/dev/null && roots+=("$(dirname "$(dirname "$(command -v nvcc)")")")
  local r d
  for r in "${roots[@]}"; do
    [ -n "$r" ] || continue
    for d in "$r/lib64" "$r/lib" "$r/targets/x86_64-linux/lib"; do
      compgen -G "$d/libcublas.so.*" >/dev/null && echo "$d"
    done
  done | awk '!seen[$0]++' | paste -sd:
}

# cuDNN 9 on the GPU machine (optional: without it the cuDNN entries say SKIP): the toolkit's
# directories, or the copy PyTorch's wheels bring (nvidia-cudnn-cu*, older wheels: torch/lib).
cudnn_lib_dirs() {
  local roots=("${CUDNN_HOME:-}" "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13)
  local r d
  {
    for r in "${roots[@]}"; do
      [ -n "$r" ] || continue
      for d in "$r/lib64" "$r/lib" "$r/targets/x86_64-linux/lib"; do
        compgen -G "$d/libcudnn.so.9*" >/dev/null && echo "$d"
      done
    done
    command -v python3 >/dev/null && python3 - <<'PY' 2>/dev/null
import importlib.util, os
for name, sub in (("nvidia.cudnn", "lib"), ("torch", "lib")):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    for root in (spec.submodule_search_locations or []) if spec else []:
        d = os.path.join(root, sub)
        if os.path.exists(os.path.join(d, "libcudnn.so.9")):
            print(d)
PY
  } | awk '!seen[$0]++' | paste -sd:
}

find_programs() {
  local bundle=$1
  if [ -x "$bundle/bin/${PROGRAMS[0]}" ]; then
    BIN_DIR=$bundle/bin
    local abs cuda cudnn
    abs=$(cd "$bundle" && pwd)
    cuda=$(cuda_lib_dirs)
    cudnn=$(cudnn_lib_dirs)
    export LD_LIBRARY_PATH="$abs/lib${cuda:+:$cuda}${cudnn:+:$cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
    STEP_STATUS[$step]="skipped (no time left)"
    return 3
  fi
  echo "== $step: $prog $* (time limit $limit s)"
  timeout --kill-after=10 "$limit" "$BIN_DIR/$prog" "$@"
  local rc=$?
  case $rc in
    0) STEP_STATUS[$step]="passed" ;;
    1) STEP_STATUS[$step]="FAILED (a check failed)" ;;
    2) STEP_STATUS[$step]="no CUDA device" ;;
    124 | 137)
      STEP_STATUS[$step]="TIMED OUT after $limit s"
      rc=3
      ;;
    *)
      STEP_STATUS[$step]="ERROR (exit status $rc)"
      rc=3
      ;;
  esac
  return "$rc"
}

step_kernels() {
  run_program kernels 300 llamatrain_gpu_check --table "$RESULTS/kernels-table.md"
}

gpu_run() {
  local bundle=$1
  check_gpu
  find_programs "$bundle"
  local worst=0 step rc
  for step in "${STEPS[@]}"; do
    "step_$step"
    rc=$?
    ((rc > worst)) && worst=$rc
  done
  echo
  echo "== gpu-check summary ($((SECONDS - START)) s of $BUDGET s)"
  for step in "${STEPS[@]}"; do echo "  $step: ${STEP_STATUS[$step]:-not run}"; done
  echo "  results: $RESULTS"
  return $worst
}

# ---- main ----------------------------------------------------------------------------------------------
mode=run
while (($# > 0)); do
  case "$1" in
    --bundle)
      mode=bundle
      if (($# > 1)) && [[ $2 != -* ]]; then BUNDLE_DIR=$2 && shift; fi
      ;;
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

if [ "$mode" = bundle ]; then
  make_bundle "$BUNDLE_DIR"
  exit $?
fi

if [ -n "${OUT:-}" ]; then
  RESULTS=$OUT/gpu-check
else
  RESULTS=build-gpu/results/$(date -u +%Y%m%dT%H%M%SZ)
fi
mkdir -p "$RESULTS" || die 3 "cannot create $RESULTS"
gpu_run "$BUNDLE_DIR" 2>&1 | tee "$RESULTS/gpu-check.log"
exit "${PIPESTATUS[0]}"
