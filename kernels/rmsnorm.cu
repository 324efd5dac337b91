// RMSNorm kernels: one block per row, fp32 sums reduced by warp shuffles then across warps through
// shared memory. Semantics and formulas: src/backend/cpu/rmsnorm_cpu.cpp.
#include "rmsnorm.cuh"

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct RmsnormTraits {
  static constexpr int kThreads = 256;        // per row at most; 8 warps
  static constexpr int kElementsPerThread = 8;  // fewer warps for rows under 2048 (row_threads)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kDwThreads = 256;      // columns per dweight block
  static constexpr int kDwRowsPerChunk = 64;  // rows summed by one dweight block
};

// Sum over the block; every thread gets the result. `partial` holds one float per warp. Each kernel
// calls it once; a second call on the same `partial` would need a barrier before it (the
// simulator's barrier tests, tests/sim/test_sim_strict.cpp, would show the race).
__device__ __forceinline__ float block_sum(float v, float* partial) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float s = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.f;
  for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  return s;
}

__global__ void __launch_bounds__(RmsnormTraits::kThreads) rmsnorm_forward_kernel(RmsnormForwardParams p) {
  __shared__ float partial[RmsnormTraits::kWarps];
  const int row = blockIdx.x;
  const __nv_bfloat16* x = p.x + row * p.x_row_stride;
  __nv_bfloat16* out = p.out + row * p.out_row_stride;
  float ss = 0.f;
  for (int c = threadIdx.x; c < p.C; c += blockDim.x) {
    const float v = __bfloat162float(x[c]);
    ss += v * v;
  }
  ss = block_sum(ss, partial);
  const float r = rsqrtf(ss / static_cast<float>(p.C) + p.eps);
  if (threadIdx.x == 0) p.rstd[row] = r;
  for (int c = threadIdx.x; c < p.C; c += blockDim.x)
    out[c] = __float2bfloat16(__bfloat162float(x[c]) * r * __bfloat162float(p.weight[c]));
}

__global__ void __launch_bounds__(RmsnormTraits::kThreads) rmsnorm_backward_dx_kernel(RmsnormBackwardParams p) {
  __shared__ float partial[RmsnormTraits::kWarps];
  const int row = blockIdx.x;
  const __nv_bfloat16* x = p.x + row * p.x_row_stride;
  const __nv_bfloat16* g = p.dout + row * p.dout_row_stride;
  __nv_bfloat16* dx = p.dx + row * p.dx_row_stride;
  float dot = 0.f;  // sum_k w_k g_k x_k
  for (int c = threadIdx.x; c < p.C; c += blockDim.x)
    dot += __bfloat162float(p.weight[c]) * __bfloat162float(g[c]) * __bfloat162float(x[c]);
  dot = block_sum(dot, partial);
  const float r = p.rstd[row];
  const float b = r * r * r * dot / static_cast<float>(p.C);
  for (int c = threadIdx.x; c < p.C; c += blockDim.x) {
    const float v = r * __bfloat162float(p.weight[c]) * __bfloat162float(g[c]) - b * __bfloat162float(x[c]);
    dx[c] = __float2bfloat16(v);
  }
}

// Block (blockIdx.x, blockIdx.y) sums rows [y * kDwRowsPerChunk, ...) of its columns into
// scratch[y, c]; adjacent threads read adjacent columns (coalesced).
__global__ void __launch_bounds__(RmsnormTraits::kDwThreads) rmsnorm_backward_dw_partial_kernel(RmsnormBackwardParams p) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= p.C) return;
  const int r0 = blockIdx.y * RmsnormTraits::kDwRowsPerChunk;
  const int r1 = r0 + RmsnormTraits::kDwRowsPerChunk < p.N ? r0 + RmsnormTraits::kDwRowsPerChunk : p.N;
  float acc = 0.f;
  for (int i = r0; i < r1; ++i)
    acc += __bfloat162float(p.dout[i * p.dout_row_stride + c]) * __bfloat162float(p.x[i * p.x_row_stride + c]) * p.rstd[i];
  p.scratch[static_cast<int64_t>(blockIdx.y) * p.C + c] = acc;
}

__global__ void __launch_bounds__(RmsnormTraits::kDwThreads) rmsnorm_backward_dw_reduce_kernel(RmsnormBackwardParams p, int n_chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= p.C) return;
  float acc = 0.f;
  for (int k = 0; k < n_chunks; ++k) acc += p.scratch[static_cast<int64_t>(k) * p.C + c];
  p.dweight[c] += acc;
}

int row_threads(int C) { return row_block_threads(C, RmsnormTraits::kElementsPerThread, RmsnormTraits::kThreads); }

int dw_chunks(int N) { return (N + RmsnormTraits::kDwRowsPerChunk - 1) / RmsnormTraits::kDwRowsPerChunk; }

}  // namespace

void rmsnorm_forward_cuda(const RmsnormForwardParams& p, cudaStream_t stream) {
  if (p.N <= 0 || p.C <= 0) return;
  launch_kernel(rmsnorm_forward_kernel, dim3(p.N), dim3(row_threads(p.C)), 0, stream, p);
}

size_t rmsnorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(dw_chunks(N)) * static_cast<size_t>(C);
}

void rmsnorm_backward_cuda(const RmsnormBackwardParams& p, cudaStream_t stream) {
  if (p.N <= 0 || p.C <= 0) return;
  launch_kernel(rmsnorm_backward_dx_kernel, dim3(p.N), dim3(row_threads(p.C)), 0, stream, p);
  if (!p.dweight) return;  // a frozen weight (LoRA's base): no gradient
  const int n_chunks = dw_chunks(p.N);
  const dim3 dw_grid((p.C + RmsnormTraits::kDwThreads - 1) / RmsnormTraits::kDwThreads, n_chunks);
  launch_kernel(rmsnorm_backward_dw_partial_kernel, dw_grid, dim3(RmsnormTraits::kDwThreads), 0, stream, p);
  launch_kernel(rmsnorm_backward_dw_reduce_kernel, dim3(dw_grid.x), dim3(RmsnormTraits::kDwThreads), 0, stream,
                p, n_chunks);
}

LT_CUDA_NAMESPACE_END
