// Optimizer kernels: element-wise grid-stride loops (AdamW, scale, cast) and a two-pass
// deterministic sum of squares. Semantics: src/backend/cpu/optimizer_ops_cpu.cpp.
#include "optimizer.cuh"

#include <cmath>
#include <cstring>

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct OptimizerTraits {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr unsigned kMaxBlocks = 4096;       // element-wise grids; larger n loops
  static constexpr unsigned kMaxSumBlocks = 1024;    // first pass of sum_squares
  static constexpr size_t kSumElemsPerThread = 8;    // target work per thread in the first pass
};

unsigned elementwise_blocks(size_t n) {
  const size_t b = (n + OptimizerTraits::kThreads - 1) / OptimizerTraits::kThreads;
  return static_cast<unsigned>(b < OptimizerTraits::kMaxBlocks ? b : OptimizerTraits::kMaxBlocks);
}

// The number of first-pass blocks depends only on n, so the summation order does too.
unsigned sum_blocks(size_t n) {
  const size_t per_block = static_cast<size_t>(OptimizerTraits::kThreads) * OptimizerTraits::kSumElemsPerThread;
  const size_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < OptimizerTraits::kMaxSumBlocks ? (b > 0 ? b : 1) : OptimizerTraits::kMaxSumBlocks);
}

// The CPU op's operations in its order, each rounded on its own: __fmul_rn/__fadd_rn are never
// contracted into a fused multiply-add (nvcc contracts a*b+c by default), and IEEE division and sqrtf
// are correctly rounded on both sides, so the result has the CPU op's bits. Optimizer state offloaded
// to the host (lt::cpu::adamw_update) and state kept on the device then take identical steps. The cost
// is nil: the kernel is bound by memory (gpu-check's adamw_update row).
__global__ void __launch_bounds__(OptimizerTraits::kThreads) adamw_kernel(AdamwParams p, float bc1, float bc2) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const float c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const float g = p.grad ? p.grad[i] : __bfloat162float(p.grad_bf16[i]);
    const float mi = __fadd_rn(__fmul_rn(p.beta1, p.m[i]), __fmul_rn(c1, g));
    const float vi = __fadd_rn(__fmul_rn(p.beta2, p.v[i]), __fmul_rn(__fmul_rn(c2, g), g));
    p.m[i] = mi;
    p.v[i] = vi;
    const float m_hat = mi / bc1;
    const float v_hat = vi / bc2;
    float w = p.param[i];
    w = __fsub_rn(w, __fmul_rn(p.lr, __fadd_rn(m_hat / (sqrtf(v_hat) + p.eps), __fmul_rn(p.weight_decay, w))));
    p.param[i] = w;
    if (p.param_bf16) p.param_bf16[i] = __float2bfloat16(w);
  }
}

// Sum over the block in double, tree order fixed by the thread layout; thread 0 gets the result.
__device__ __forceinline__ double block_sum_f64(double s, double* partial) {
  for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  double t = lane < OptimizerTraits::kWarps ? partial[lane] : 0.0;
  for (int m = 16; m > 0; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
  return t;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__global__ void __launch_bounds__(OptimizerTraits::kThreads) sum_squares_partial_kernel(const T* x, size_t n, double* scratch) {
  __shared__ double partial[OptimizerTraits::kWarps];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  double s = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = to_float(x[i]);
    s += v * v;
  }
  s = block_sum_f64(s, partial);
  if (threadIdx.x == 0) scratch[blockIdx.x] = s;
}

__global__ void __launch_bounds__(OptimizerTraits::kThreads) sum_squares_final_kernel(double* out, const double* scratch, int n_partials) {
  __shared__ double partial[OptimizerTraits::kWarps];
  double s = 0.0;
  for (int k = threadIdx.x; k < n_partials; k += blockDim.x) s += scratch[k];
  s = block_sum_f64(s, partial);
  if (threadIdx.x == 0) *out = s;
}

__global__ void __launch_bounds__(OptimizerTraits::kThreads) scale_kernel(float* x, float s, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= s;
}

__global__ void __launch_bounds__(OptimizerTraits::kThreads) scale_bf16_kernel(__nv_bfloat16* x, float s, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = __float2bfloat16(__bfloat162float(x[i]) * s);
}

// As lt::bf16_round_stochastic: a uniform 16-bit value added to the 16 bits bf16 drops carries into
// the kept ones with probability (dropped bits) / 2^16; non-finite sums round to nearest.
__global__ void __launch_bounds__(OptimizerTraits::kThreads)
    add_stochastic_bf16_kernel(__nv_bfloat16* y, const float* x, size_t n, uint64_t seed, size_t index0) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float sum = __bfloat162float(y[i]) + x[i];
    uint32_t u;
    memcpy(&u, &sum, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) {
      y[i] = __float2bfloat16(sum);
      continue;
    }
    u += static_cast<uint32_t>(mix64(seed ^ (index0 + i))) & 0xffffu;
    y[i] = __ushort_as_bfloat16(static_cast<unsigned short>(u >> 16));
  }
}

__global__ void __launch_bounds__(OptimizerTraits::kThreads) add_kernel(float* y, const float* x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] += x[i];
}

__global__ void __launch_bounds__(OptimizerTraits::kThreads) cast_kernel(__nv_bfloat16* out, const float* x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16(x[i]);
}

__global__ void __launch_bounds__(OptimizerTraits::kThreads) widen_kernel(float* out, const __nv_bfloat16* x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __bfloat162float(x[i]);
}

}  // namespace

void adamw_update_cuda(const AdamwParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  // As lt::cpu::adamw_update: 1 - beta^t in double, rounded to fp32 once.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), p.t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), p.t));
  launch_kernel(adamw_kernel, dim3(elementwise_blocks(p.n)), dim3(OptimizerTraits::kThreads), 0, stream, p, bc1, bc2);
}

size_t sum_squares_scratch_doubles(size_t n) { return sum_blocks(n); }

namespace {
template <class T>
void sum_squares_any(double* out, const T* x, size_t n, double* scratch, cudaStream_t stream) {
  const unsigned blocks = sum_blocks(n);  // n == 0 still writes *out = 0
  launch_kernel(sum_squares_partial_kernel<T>, dim3(blocks), dim3(OptimizerTraits::kThreads), 0, stream, x, n, scratch);
  launch_kernel(sum_squares_final_kernel, dim3(1), dim3(OptimizerTraits::kThreads), 0, stream, out,
                static_cast<const double*>(scratch), static_cast<int>(blocks));
}
}  // namespace

void sum_squares_cuda(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream) {
  sum_squares_any(out, x, n, scratch, stream);
}

void sum_squares_cuda(double* out, const __nv_bfloat16* x, size_t n, double* scratch, cudaStream_t stream) {
  sum_squares_any(out, x, n, scratch, stream);
}

void scale_inplace_cuda(float* x, float s, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(scale_kernel, dim3(elementwise_blocks(n)), dim3(OptimizerTraits::kThreads), 0, stream, x, s, n);
}

void scale_inplace_cuda(__nv_bfloat16* x, float s, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(scale_bf16_kernel, dim3(elementwise_blocks(n)), dim3(OptimizerTraits::kThreads), 0, stream, x, s, n);
}

void add_stochastic_bf16_cuda(__nv_bfloat16* y, const float* x, size_t n, uint64_t seed, size_t index0,
                              cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(add_stochastic_bf16_kernel, dim3(elementwise_blocks(n)), dim3(OptimizerTraits::kThreads), 0, stream, y,
                x, n, seed, index0);
}

void add_inplace_cuda(float* y, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(add_kernel, dim3(elementwise_blocks(n)), dim3(OptimizerTraits::kThreads), 0, stream, y, x, n);
}

void cast_f32_to_bf16_cuda(__nv_bfloat16* out, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(cast_kernel, dim3(elementwise_blocks(n)), dim3(OptimizerTraits::kThreads), 0, stream, out, x, n);
}

void cast_bf16_to_f32_cuda(float* out, const __nv_bfloat16* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(widen_kernel, dim3(elementwise_blocks(n)), dim3(OptimizerTraits::kThreads), 0, stream, out, x, n);
}

LT_CUDA_NAMESPACE_END
