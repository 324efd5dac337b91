#!/usr/bin/env bash
# The sanitizer stage of the test suite (scripts/test.sh, so CI): the ASan + UBSan build (CMake
# option LLAMATRAIN_SANITIZE; -O0, the compute code -O1) of llamatrain, llamatrain_tests,
# llamatrain_fault_tests and the canary in ${ASAN_BUILD_DIR:-build-asan}, and the tests labelled
# "sanitize" run against it: first the canary's (Sanitize.*: the checks are really on), then the
# unit tests, the CLI's bad-input and option tests and the fault tests, where any invalid memory
# access, leak or undefined behaviour fails the test. Long training tests (Checkpoint.*,
# EvalTaskCli.*, and the fault suite's SIGKILL trials under mpirun, FaultsKill.*) run only in the
# main build; they exercise no code the others do not.
#   scripts/test-sanitize.sh [build|test]   (default both; test.sh runs the build beside its main
#                                            tests, then the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ci-stage.sh
export BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
what=${1:-all}
sanitize_build() {
  CMAKE_ARGS="-DLLAMATRAIN_SANITIZE=ON -DLLAMATRAIN_CUDA=OFF -DLLAMATRAIN_BENCHMARKS=OFF ${CMAKE_ARGS:-}" \
    bash scripts/build.sh llamatrain llamatrain_tests llamatrain_fault_tests sanitize_canary
}
case $what in
  build) sanitize_build; exit 0 ;;
  all) stage sanitize-build sanitize_build ;;
  test) ;;
  *) echo "usage: scripts/test-sanitize.sh [build|test]" >&2; exit 2 ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI and HDF5 keep some allocations until exit by design; their leaks are not ours.
# Ranks started by mpirun unwind fully on malloc (fast_unwind_on_malloc=0, passed to them through
# Open MPI's mca_base_env_list): Open MPI and HDF5 are built without frame pointers, and the
# frame-pointer unwinder leaves their allocations with stacks no suppression can name (38 reported
# leaks in a 2-rank run, 0 with it). Single processes keep the fast unwinder: the full one made
# allocation-heavy runs 11 times slower (SentencePiece training in `prepare`: 32.7 s against 2.9 s).
# use_tls=0: LeakSanitizer's reading of the dynamic TLS of a library opened with dlopen (oneDNN,
# --precision bf16) crashes it ("Tracer caught signal 11", GCC 12's runtime with glibc 2.36); with
# thread-local storage not scanned, what is reachable only from there counts as leaked: our
# per-thread state that outlives its thread's last use is owned by a global (matmul_onednn.cpp), and
# the libraries' per-thread caches are suppressed (lsan.supp).
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0:use_tls=0"
export OMPI_MCA_mca_base_env_list="LSAN_OPTIONS=$LSAN_OPTIONS:fast_unwind_on_malloc=0"
# Open MPI unloads its components (dlclose) before exit, and the leaks they keep by design then come
# from "<unknown module>", which no suppression can name: keep them loaded.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
stage_tests tests-sanitize-canary "$BUILD_DIR" --output-on-failure -R '^Sanitize\.'
# Three at a time, as the main tests (scripts/test.sh): the MPI and fault tests wait on processes.
stage_tests tests-sanitize "$BUILD_DIR" --output-on-failure -j "${TEST_JOBS:-3}" --timeout 900 -L sanitize \
  -E '^(Checkpoint|EvalTaskCli|FaultsKill|Sanitize)\.'
