// SwiGLU kernels: element-wise, grid (rows, column chunks); each thread walks its row's columns
// with a stride of the chunk count times the block size. Semantics: src/backend/cpu/elementwise_cpu.cpp.
#include "swiglu.cuh"

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct SwigluTraits {
  static constexpr int kThreads = 256;        // columns per block step
  static constexpr unsigned kMaxChunks = 64;  // column chunks per row (grid y); larger F loops
};

// sigmoid(a) = 1 / (1 + exp(-a)); exp overflows to inf for a << 0 and the reciprocal gives 0.
__device__ __forceinline__ float sigmoid_f32(float a) { return __frcp_rn(1.f + __expf(-a)); }

__global__ void __launch_bounds__(SwigluTraits::kThreads) swiglu_forward_kernel(SwigluForwardParams p) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* h1 = p.h1 + row * p.h1_row_stride;
  const __nv_bfloat16* h3 = p.h3 + row * p.h3_row_stride;
  __nv_bfloat16* out = p.out + row * p.out_row_stride;
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < p.F; c += gridDim.y * blockDim.x) {
    const float a = __bfloat162float(h1[c]), b = __bfloat162float(h3[c]);
    out[c] = __float2bfloat16(a * sigmoid_f32(a) * b);
  }
}

__global__ void __launch_bounds__(SwigluTraits::kThreads) swiglu_backward_kernel(SwigluBackwardParams p) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* g = p.dout + row * p.dout_row_stride;
  const __nv_bfloat16* h1 = p.h1 + row * p.h1_row_stride;
  const __nv_bfloat16* h3 = p.h3 + row * p.h3_row_stride;
  __nv_bfloat16* dh1 = p.dh1 + row * p.dh1_row_stride;
  __nv_bfloat16* dh3 = p.dh3 + row * p.dh3_row_stride;
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < p.F; c += gridDim.y * blockDim.x) {
    const float a = __bfloat162float(h1[c]), b = __bfloat162float(h3[c]), d = __bfloat162float(g[c]);
    const float s = sigmoid_f32(a);
    const float ds = d * s;
    dh1[c] = __float2bfloat16(ds * b * (1.f + a * (1.f - s)));
    dh3[c] = __float2bfloat16(ds * a);
  }
}

dim3 swiglu_grid(int N, int F) {
  unsigned chunks = (static_cast<unsigned>(F) + SwigluTraits::kThreads - 1) / SwigluTraits::kThreads;
  if (chunks > SwigluTraits::kMaxChunks) chunks = SwigluTraits::kMaxChunks;
  return dim3(static_cast<unsigned>(N), chunks);
}

}  // namespace

void swiglu_forward_cuda(const SwigluForwardParams& p, cudaStream_t stream) {
  if (p.N <= 0 || p.F <= 0) return;
  launch_kernel(swiglu_forward_kernel, swiglu_grid(p.N, p.F), dim3(SwigluTraits::kThreads), 0, stream, p);
}

void swiglu_backward_cuda(const SwigluBackwardParams& p, cudaStream_t stream) {
  if (p.N <= 0 || p.F <= 0) return;
  launch_kernel(swiglu_backward_kernel, swiglu_grid(p.N, p.F), dim3(SwigluTraits::kThreads), 0, stream, p);
}

LT_CUDA_NAMESPACE_END
