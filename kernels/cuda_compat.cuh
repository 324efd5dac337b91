// What every kernel source includes first: the CUDA runtime and bf16 under nvcc, the host
// simulator (kernels/sim/cuda_sim.h) otherwise, and the two spellings that differ between them,
// so kernel code itself has no #ifdef:
// * lt::launch_kernel(kernel, grid, block, smem_bytes, stream, args...) is
//   kernel<<<grid, block, smem_bytes, stream>>>(args...) under nvcc (followed by a launch check)
//   and a simulated launch otherwise.
// * LT_DYNAMIC_SMEM(T, name) declares `T* name` pointing at the block's dynamic shared memory
//   (the `extern __shared__` array, 16-byte aligned) in both builds.
// * lt::set_max_dynamic_smem(kernel, bytes) is the opt-in for more than 48 KiB of dynamic shared
//   memory (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)); the
//   simulator refuses launches above 48 KiB without it, as the device does.
// * LT_CUDA_NAMESPACE_BEGIN / _END open and close lt::cuda inside an inline namespace named after
//   the build (lt::gpu under nvcc, lt::simulated otherwise). Code still says lt::cuda::rope_forward_cuda,
//   but the two builds of the same source get different symbols, so one executable can link both
//   (`--device cuda` and `--device cuda-sim`) without one definition silently replacing the other.
//   launch_kernel is flavoured the same way for the same reason.
// * lt::row_block_threads(n, per_thread, max_threads): the block size of a kernel that reduces one
//   row of n elements per block (below).
#pragma once

#if defined(__CUDACC__)
#define LT_CUDA_FLAVOR gpu
#else
#define LT_CUDA_FLAVOR simulated
#endif
#define LT_CUDA_NAMESPACE_BEGIN \
  namespace lt {                \
  inline namespace LT_CUDA_FLAVOR {   \
  namespace cuda {
#define LT_CUDA_NAMESPACE_END \
  }                           \
  }                           \
  }

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
// Before a loop nvcc must keep rolled: its body is scheduled one trip at a time, so fewer values
// are live (attention_tc.cu's forward spilled with every k-step unrolled). The loop must not index
// register arrays by its counter. g++ would warn about the pragma: the simulator gets nothing.
#define LT_NO_UNROLL _Pragma("unroll 1")

namespace lt {
inline namespace LT_CUDA_FLAVOR {

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("kernel launch failed: ") + cudaGetErrorString(err));
}

template <class... Params>
void set_max_dynamic_smem(void (*kernel)(Params...), size_t bytes) {
  const cudaError_t err =
      cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed: ") +
                             cudaGetErrorString(err));
}

}  // inline namespace LT_CUDA_FLAVOR
}  // namespace lt

#else  // host simulator

#include "sim/cuda_sim.h"

#define LT_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::lt::sim::dynamic_smem())
#define LT_NO_UNROLL

namespace lt {
inline namespace LT_CUDA_FLAVOR {

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  sim::launch(kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

template <class... Params>
void set_max_dynamic_smem(void (*kernel)(Params...), size_t bytes) {
  sim::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // inline namespace LT_CUDA_FLAVOR
}  // namespace lt

#endif

namespace lt {
// Threads for a block that reduces one row of n elements: one per `per_thread` elements, in whole
// warps, at least one warp and at most max_threads. A wide row (a model's 4096 or 32000) gets
// max_threads; a narrow one (the tiny model's 64 and 512) no warps that would hold no element and
// only join the reduction's shuffles and barriers (which the simulator runs thread by thread).
constexpr int row_block_threads(int n, int per_thread, int max_threads) {
  const int warps = (n + 32 * per_thread - 1) / (32 * per_thread);
  return warps < 1 ? 32 : (32 * warps < max_threads ? 32 * warps : max_threads);
}
static_assert(row_block_threads(64, 8, 256) == 32 && row_block_threads(512, 8, 256) == 64 &&
                  row_block_threads(257, 8, 256) == 64 && row_block_threads(4096, 8, 256) == 256 &&
                  row_block_threads(32000, 8, 256) == 256 && row_block_threads(0, 8, 256) == 32,
              "row_block_threads: a warp per 256 elements, 1 to max_threads / 32 warps");
}  // namespace lt
