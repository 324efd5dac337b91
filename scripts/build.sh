#!/usr/bin/env bash
# Configures and builds llamatrain (Release) into ${BUILD_DIR:-build}: everything (tests,
# benchmarks, fuzz targets), or only the CMake targets given as arguments (e.g. `llamatrain`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# Ninja where it is installed (scripts/install-deps.sh installs it) and the build folder is new: it
# keeps both cores busy across targets, and its log (.ninja_log) times every step for
# scripts/ci-profile.sh. A folder configured before keeps its generator.
generator=()
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-} >/dev/null
if (($# > 0)); then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "$@"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
