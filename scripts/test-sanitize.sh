#!/usr/bin/env bash
# The ASan + UBSan build (CMake option LLAMATRAIN_SANITIZE) of llamatrain and llamatrain_tests in
# ${ASAN_BUILD_DIR:-build-asan}, and the tests labelled "sanitize" (the unit tests, the CLI's
# bad-input and option tests, the fault tests) run against it: any invalid memory access, leak or
# undefined behaviour in our code fails the test. Long training tests (Checkpoint.*,
# EvalTaskCli.*, and the fault suite's SIGKILL trials under mpirun, FaultsKill.*) run only in the
# main build; they exercise no code the others do not.
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
CMAKE_ARGS="-DLLAMATRAIN_SANITIZE=ON -DLLAMATRAIN_CUDA=OFF -DLLAMATRAIN_BENCHMARKS=OFF ${CMAKE_ARGS:-}" \
  bash scripts/build.sh llamatrain llamatrain_tests llamatrain_fault_tests
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI and HDF5 keep some allocations until exit by design; their leaks are not ours.
# fast_unwind_on_malloc=0: the libraries are built without frame pointers, and the frame-pointer
# unwinder stops in them before reaching the frame that a suppression names.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
# Open MPI unloads its components (dlclose) before exit, and the leaks they keep by design then come
# from "<unknown module>", which no suppression can name: keep them loaded.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${TEST_JOBS:-1}" --timeout 900 -L sanitize \
  -E '^(Checkpoint|EvalTaskCli|FaultsKill)\.'
