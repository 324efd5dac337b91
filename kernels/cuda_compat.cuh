// What every kernel source includes first: the CUDA runtime and bf16 under nvcc, the host
// simulator (kernels/sim/cuda_sim.h) otherwise, and the two spellings that differ between them,
// so kernel code itself has no #ifdef:
// * lt::launch_kernel(kernel, grid, block, smem_bytes, stream, args...) is
//   kernel<<<grid, block, smem_bytes, stream>>>(args...) under nvcc (followed by a launch check)
//   and a simulated launch otherwise.
// * LT_DYNAMIC_SMEM(T, name) declares `T* name` pointing at the block's dynamic shared memory
//   (the `extern __shared__` array, 16-byte aligned) in both builds.
#pragma once

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#define LT_DYNAMIC_SMEM(T, name)                                       \
  extern __shared__ __align__(16) unsigned char lt_dynamic_smem_raw[]; \
  T* name = reinterpret_cast<T*>(lt_dynamic_smem_raw)

namespace lt {

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("kernel launch failed: ") + cudaGetErrorString(err));
}

}  // namespace lt

#else  // host simulator

#include "sim/cuda_sim.h"

#define LT_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::lt::sim::dynamic_smem())

namespace lt {

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  sim::launch(kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace lt

#endif
