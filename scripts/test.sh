#!/usr/bin/env bash
# The whole test suite: install what is missing, build (with tests), run CTest. With LT_SANITIZE=1
# also the sanitizer build (AddressSanitizer + UBSan, in build-asan) of the CLI and its tests, and
# those tests under it (scripts/test-sanitize.sh). Not part of CI's run: its cold build alone took
# 1772 CPU-seconds at -O1 (about 15 min on 2 cores, measured 2026-12-01), which on top of the main
# build and suite (about 24 min in CI) exceeds the 45 min a cold CI run may take (issue 15, item 10).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# Tests launch mpirun as root in CI; Open MPI refuses that without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${TEST_JOBS:-1}" --timeout 900
if [[ "${LT_SANITIZE:-0}" == 1 ]]; then
  bash scripts/test-sanitize.sh
fi
