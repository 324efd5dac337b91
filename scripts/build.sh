#!/usr/bin/env bash
# Configures and builds llamatrain (Release) into ${BUILD_DIR:-build}: everything (tests,
# benchmarks, fuzz targets), or only the CMake targets given as arguments (e.g. `llamatrain`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-} >/dev/null
if (($# > 0)); then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "$@"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
