#!/usr/bin/env bash
# The whole test suite, what CI runs (.ci/run): install what is missing, build (with tests), run
# CTest; then the sanitizer stage (scripts/test-sanitize.sh): the CLI, the unit tests and the fault
# tests built with AddressSanitizer + UBSan in build-asan, and those tests run against it. The
# sanitizer build runs beside the main tests at idle CPU priority: it takes only the cores the tests
# leave idle (the tests that run alone, the waits of the MPI, Slurm and signal tests), and the
# tests never wait for it. LT_SANITIZE_BESIDE=0 runs it after them instead (the tests' own times then
# are not stretched by it: for profiling them).
# LT_SANITIZE=0 leaves that stage out (a quicker local run; CI always runs it). LT_SLOW=1 adds the
# tests labelled `slow` (the quick start's accuracy, minutes of both cores) to the main tests.
# Each stage's wall time, the build logs and CTest's output are kept in ${LT_PROFILE_DIR:-build/ci-profile};
# scripts/ci-profile.sh prints where the time went (docs/building.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ci-stage.sh
stage install bash scripts/install-deps.sh
stage build bash scripts/build.sh
# Tests launch mpirun as root in CI; Open MPI refuses that without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Three tests at a time (TEST_JOBS) on CI's two cores: many tests wait (on mpirun, Slurm, signals,
# timeouts); the tests whose ranks or timings need the machine to themselves are RUN_SERIAL
# (tests/CMakeLists.txt). Three was 21-46 s shorter than two in paired cold runs.
sanitize=${LT_SANITIZE:-1} beside=${LT_SANITIZE_BESIDE:-1}
if [[ $sanitize != 0 && $beside != 0 ]]; then
  stage_beside sanitize-build "$LT_PROFILE_DIR/sanitize-build.log" bash scripts/test-sanitize.sh build
fi
# Tests labelled `slow` (minutes each: Quickstart.accuracy) run only with LT_SLOW=1.
slow=()
[[ ${LT_SLOW:-0} != 0 ]] || slow=(-LE slow)
stage_tests tests-main "${BUILD_DIR:-build}" --output-on-failure -j "${TEST_JOBS:-3}" --timeout 900 "${slow[@]}"
if [[ $sanitize != 0 && $beside != 0 ]]; then
  stage_join sanitize-build-rest
  bash scripts/test-sanitize.sh test
elif [[ $sanitize != 0 ]]; then
  bash scripts/test-sanitize.sh
fi
stage_summary
