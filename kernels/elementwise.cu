// Element-wise kernels: a grid-stride loop over the flat index, two elements (one bf16x2) per
// step when the pointers allow it. Semantics: src/backend/cpu/elementwise_cpu.cpp.
#include "elementwise.cuh"

#include <cmath>

#include "llamatrain/mix64.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct ElementwiseTraits {
  static constexpr int kThreads = 256;
  static constexpr unsigned kMaxBlocks = 4096;  // larger n loops
};

__global__ void __launch_bounds__(ElementwiseTraits::kThreads)
    residual_add_kernel(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// The same on bf16 pairs: n2 = n / 2 pairs, every pointer 4-byte aligned.
__global__ void __launch_bounds__(ElementwiseTraits::kThreads)
    residual_add_pairs_kernel(__nv_bfloat162* out, const __nv_bfloat162* a, const __nv_bfloat162* b, size_t n2) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n2; i += stride) {
    const float2 x = __bfloat1622float2(a[i]), y = __bfloat1622float2(b[i]);
    out[i] = __floats2bfloat162_rn(x.x + y.x, x.y + y.y);
  }
}

// Element i is kept when its 53-bit draw k = mix64(base + i) >> 11 is at least `dropped`
// (ceil(p 2^53): k 2^-53 < p exactly when k < dropped).
__global__ void __launch_bounds__(ElementwiseTraits::kThreads)
    dropout_kernel(__nv_bfloat16* out, const __nv_bfloat16* x, size_t n, uint64_t base, uint64_t dropped,
                   float keep_scale) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t k = lt::mix64(base + i) >> 11;
    out[i] = k < dropped ? __float2bfloat16(0.f) : __float2bfloat16(__bfloat162float(x[i]) * keep_scale);
  }
}

unsigned grid_for(size_t n) {
  const size_t blocks = (n + ElementwiseTraits::kThreads - 1) / ElementwiseTraits::kThreads;
  return static_cast<unsigned>(blocks < ElementwiseTraits::kMaxBlocks ? blocks : ElementwiseTraits::kMaxBlocks);
}

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

}  // namespace

void residual_add_cuda(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n,
                       cudaStream_t stream) {
  if (n == 0) return;
  if (n % 2 == 0 && aligned4(out) && aligned4(a) && aligned4(b)) {
    launch_kernel(residual_add_pairs_kernel, dim3(grid_for(n / 2)), dim3(ElementwiseTraits::kThreads), 0, stream,
                  reinterpret_cast<__nv_bfloat162*>(out), reinterpret_cast<const __nv_bfloat162*>(a),
                  reinterpret_cast<const __nv_bfloat162*>(b), n / 2);
  } else {
    launch_kernel(residual_add_kernel, dim3(grid_for(n)), dim3(ElementwiseTraits::kThreads), 0, stream, out, a, b, n);
  }
}

void dropout_cuda(__nv_bfloat16* out, const __nv_bfloat16* x, size_t n, float p, uint64_t stream,
                  cudaStream_t cuda_stream) {
  if (n == 0) return;
  const float keep_scale = 1.f / (1.f - p);  // in float, as the CPU's float op
  const uint64_t dropped = static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 0x1.0p53));
  launch_kernel(dropout_kernel, dim3(grid_for(n)), dim3(ElementwiseTraits::kThreads), 0, cuda_stream, out, x, n,
                lt::mix64(stream), dropped, keep_scale);
}

LT_CUDA_NAMESPACE_END
