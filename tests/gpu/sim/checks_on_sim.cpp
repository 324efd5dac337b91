// The device program's correctness checks (tests/gpu/kernel_checks.cu) run on the CUDA simulator:
// kernel_checks.cu compiled as host C++ against llamatrain_kernels_sim, with the five CUDA runtime
// calls it makes (cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize, cudaGetErrorString)
// provided here on host memory. It proves, without a GPU, that the checks pass on correct kernels
// (their tolerances, sizes, sentinels and references are right), so a FAIL on the device points at
// the device build, not at the check. With LT_GPUCHECK_CORRUPT=1 every device-to-host copy comes
// back with its middle 4-byte word set to a float NaN (0x7fc00000): then every kernel must FAIL,
// which proves the checks can fail. With LT_GPUCHECK_STICKY_IN=NAME the runtime is poisoned as check
// NAME begins, as an illegal address poisons a device's context: every later copy and synchronize
// fails, so the program must end with status 4 naming NAME, its results so far in --results FILE,
// and a run with --after NAME must go on from the next check (the rehearsal of
// scripts/gpu-check.sh's restart, tests/gpu/test_rehearsal.sh).
//   llamatrain_gpu_checks_sim [--after NAME] [--results FILE] [--table FILE (ignored)] [--list]
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "gpu_check_util.cuh"

namespace {
bool poisoned = false;
}

extern "C" {
cudaError_t cudaMalloc(void** ptr, size_t size) {
  *ptr = std::malloc(size);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (poisoned) return cudaErrorIllegalAddress;
  std::memcpy(dst, src, count);
  static const bool corrupt = std::getenv("LT_GPUCHECK_CORRUPT") && std::getenv("LT_GPUCHECK_CORRUPT")[0] == '1';
  if (corrupt && kind == cudaMemcpyDeviceToHost && count >= 4) {
    const uint32_t nan = 0x7fc00000u;
    std::memcpy(static_cast<char*>(dst) + (count / 2 & ~size_t{3}), &nan, 4);
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return poisoned ? cudaErrorIllegalAddress : cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "simulated CUDA runtime error"; }
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  lt::gpucheck::Checks ck;
  std::string after;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--after" && i + 1 < argc) {
      after = argv[++i];
    } else if (a == "--results" && i + 1 < argc) {
      ck.write_results_to(argv[++i]);
    } else if (a == "--table" && i + 1 < argc) {
      std::printf("(no benchmarks on the simulator: %s stays unwritten)\n", argv[++i]);
    } else if (a == "--list") {
      for (const auto& n : lt::gpucheck::kernel_check_names()) std::printf("check %s\n", n.c_str());
      return 0;
    } else {
      std::fprintf(stderr, "usage: llamatrain_gpu_checks_sim [--after NAME] [--results FILE] [--table FILE] [--list]\n");
      return 64;
    }
  }
  if (const char* sticky = std::getenv("LT_GPUCHECK_STICKY_IN")) {
    static const std::string name = sticky;
    lt::gpucheck::Checks::begin_hook = [](const std::string& kernel) { poisoned = poisoned || kernel == name; };
  }
  try {
    lt::gpucheck::run_kernel_checks(ck, after);
  } catch (const lt::gpucheck::StickyError& e) {
    std::printf("llamatrain_gpu_check: STICKY checks %s: %s\n", e.family.c_str(), e.what());
    return 4;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "llamatrain_gpu_checks_sim: %s\n", e.what());
    return 64;
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 3;
  }
  for (const auto& r : ck.skipped()) std::printf("SKIP %s: %s\n", r.first.c_str(), r.second.c_str());
  std::printf("%zu kernels, %d failed\n", ck.results().size(), ck.failures());
  return ck.failures() > 0 ? 1 : 0;
}
