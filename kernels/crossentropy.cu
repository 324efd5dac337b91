// Fused softmax + cross-entropy kernels: one block per row. Forward: each thread runs an online
// softmax (running max m and sum s of exp(x - m)) over a strided slice of the row, then the
// (m, s) pairs are merged by warp shuffles and across warps through shared memory. Backward:
// element-wise from the lse cache. Semantics: src/backend/cpu/crossentropy_cpu.cpp.
#include "crossentropy.cuh"

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct CrossentropyTraits {
  static constexpr int kThreads = 256;  // per row at most; 8 warps
  static constexpr int kElementsPerThread = 8;  // fewer warps for rows under 2048 (row_threads)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSumThreads = 256;  // the one block of the loss sum
};

// (m, s) <- the pair describing the union of both slices. An empty slice is (-inf, 0).
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

__global__ void __launch_bounds__(CrossentropyTraits::kThreads) crossentropy_forward_kernel(CrossentropyForwardParams p) {
  __shared__ float part_m[CrossentropyTraits::kWarps];
  __shared__ float part_s[CrossentropyTraits::kWarps];
  const int row = blockIdx.x;
  const __nv_bfloat16* l = p.logits + row * p.logits_row_stride;
  float m = -INFINITY, s = 0.f;
  for (int c = threadIdx.x; c < p.V; c += blockDim.x) {
    const float x = __bfloat162float(l[c]);
    if (x > m) {
      s = s * __expf(m - x) + 1.f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  for (int k = 16; k > 0; k >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, k);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, k);
    merge_max_sum(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part_m[warp] = m, part_s[warp] = s;
  __syncthreads();
  if (warp != 0) return;
  const int warps = static_cast<int>(blockDim.x / 32);
  m = lane < warps ? part_m[lane] : -INFINITY;
  s = lane < warps ? part_s[lane] : 0.f;
  for (int k = 16; k > 0; k >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, k);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, k);
    merge_max_sum(m, s, m2, s2);
  }
  if (lane != 0) return;
  const float lse = m + logf(s);
  p.lse[row] = lse;
  float loss = 0.f;
  if (!p.mask || p.mask[row]) {
    const int t = p.targets[row];
    loss = (t >= 0 && t < p.V) ? lse - __bfloat162float(l[t]) : NAN;
    if (p.mask) loss *= float(p.mask[row]);  // the token's weight
  }
  p.losses[row] = loss;
}

// One block: *loss_sum = sum of losses[0, N) in double. Thread k sums rows k, k + blockDim.x, ...
// in order, then a fixed shuffle tree within warps and across warps: the order never changes.
__global__ void __launch_bounds__(CrossentropyTraits::kSumThreads) crossentropy_loss_sum_kernel(CrossentropyForwardParams p) {
  __shared__ double partial[CrossentropyTraits::kSumThreads / 32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < p.N; i += blockDim.x) acc += static_cast<double>(p.losses[i]);
  for (int k = 16; k > 0; k >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, k);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < CrossentropyTraits::kSumThreads / 32 ? partial[lane] : 0.0;
  for (int k = 16; k > 0; k >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, k);
  if (lane == 0) *p.loss_sum = acc;
}

__global__ void __launch_bounds__(CrossentropyTraits::kThreads) crossentropy_backward_kernel(CrossentropyBackwardParams p) {
  const int row = blockIdx.x;
  const __nv_bfloat16* l = p.logits + row * p.logits_row_stride;
  __nv_bfloat16* d = p.dlogits + row * p.dlogits_row_stride;
  if (p.mask && !p.mask[row]) {
    const __nv_bfloat16 zero = __float2bfloat16(0.f);
    for (int c = threadIdx.x; c < p.V; c += blockDim.x) d[c] = zero;
    return;
  }
  const float lse = p.lse[row];
  const int t = p.targets[row];
  const float g = p.mask ? p.dloss * float(p.mask[row]) : p.dloss;  // the token's weight
  for (int c = threadIdx.x; c < p.V; c += blockDim.x) {
    const float prob = __expf(__bfloat162float(l[c]) - lse);  // read before the (aliased) write
    d[c] = __float2bfloat16((c == t ? prob - 1.f : prob) * g);
  }
}

int row_threads(int V) {
  return row_block_threads(V, CrossentropyTraits::kElementsPerThread, CrossentropyTraits::kThreads);
}

}  // namespace

void crossentropy_forward_cuda(const CrossentropyForwardParams& p, cudaStream_t stream) {
  if (p.N < 0 || (p.N > 0 && p.V <= 0)) return;  // the CPU op rejects an empty vocabulary
  if (p.N > 0)
    launch_kernel(crossentropy_forward_kernel, dim3(p.N), dim3(row_threads(p.V)), 0, stream, p);
  if (p.loss_sum)  // N = 0 still writes 0
    launch_kernel(crossentropy_loss_sum_kernel, dim3(1), dim3(CrossentropyTraits::kSumThreads), 0, stream, p);
}

void crossentropy_backward_cuda(const CrossentropyBackwardParams& p, cudaStream_t stream) {
  if (p.N <= 0 || p.V <= 0) return;
  launch_kernel(crossentropy_backward_kernel, dim3(p.N), dim3(row_threads(p.V)), 0, stream, p);
}

LT_CUDA_NAMESPACE_END
