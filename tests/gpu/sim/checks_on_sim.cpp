// The device program's correctness checks (tests/gpu/kernel_checks.cu) run on the CUDA simulator:
// kernel_checks.cu compiled as host C++ against llamatrain_kernels_sim, with the five CUDA runtime
// calls it makes (cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize, cudaGetErrorString)
// provided here on host memory. It proves, without a GPU, that the checks pass on correct kernels
// (their tolerances, sizes, sentinels and references are right), so a FAIL on the device points at
// the device build, not at the check. With LT_GPUCHECK_CORRUPT=1 every device-to-host copy comes
// back with its middle 4-byte word set to a float NaN (0x7fc00000): then every kernel must FAIL,
// which proves the checks can fail.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "gpu_check_util.cuh"

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
  std::memcpy(dst, src, count);
  static const bool corrupt = std::getenv("LT_GPUCHECK_CORRUPT") && std::getenv("LT_GPUCHECK_CORRUPT")[0] == '1';
  if (corrupt && kind == cudaMemcpyDeviceToHost && count >= 4) {
    const uint32_t nan = 0x7fc00000u;
    std::memcpy(static_cast<char*>(dst) + (count / 2 & ~size_t{3}), &nan, 4);
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "simulated CUDA runtime error"; }
}

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  lt::gpucheck::Checks ck;
  try {
    lt::gpucheck::run_kernel_checks(ck);
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 3;
  }
  for (const auto& r : ck.skipped()) std::printf("SKIP %s: %s\n", r.first.c_str(), r.second.c_str());
  std::printf("%zu kernels, %d failed\n", ck.results().size(), ck.failures());
  return ck.failures() > 0 ? 1 : 0;
}
