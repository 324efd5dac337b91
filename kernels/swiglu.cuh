// SwiGLU forward/backward on the device, the twin of lt::cpu::swiglu_forward / swiglu_backward in
// include/llamatrain/ops_cpu.h. Storage bf16, math fp32. Rows are N = B*T tokens of F hidden
// units; every row pointer advances by its own row stride (elements), so a row may be padded or a
// view (e.g. h1 and h3 as the two halves of one fused (N, 2F) projection).
//   forward:  out = silu(h1) * h3, silu(a) = a * sigmoid(a)
//   backward: dh1 = dout * h3 * sigmoid(h1) * (1 + h1 * (1 - sigmoid(h1))) (=)
//             dh3 = dout * silu(h1) (=)
// Every element is read into registers before it is written, so outputs may alias inputs.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

struct SwigluForwardParams {
  __nv_bfloat16* out = nullptr;       // (N, F) row stride out_row_stride
  const __nv_bfloat16* h1 = nullptr;  // (N, F) row stride h1_row_stride (gate)
  const __nv_bfloat16* h3 = nullptr;  // (N, F) row stride h3_row_stride (up)
  int N = 0, F = 0;
  int64_t out_row_stride = 0, h1_row_stride = 0, h3_row_stride = 0;
};

void swiglu_forward_cuda(const SwigluForwardParams& p, cudaStream_t stream);

struct SwigluBackwardParams {
  __nv_bfloat16* dh1 = nullptr;         // (N, F) =, row stride dh1_row_stride
  __nv_bfloat16* dh3 = nullptr;         // (N, F) =, row stride dh3_row_stride
  const __nv_bfloat16* dout = nullptr;  // (N, F) row stride dout_row_stride
  const __nv_bfloat16* h1 = nullptr;    // (N, F) row stride h1_row_stride
  const __nv_bfloat16* h3 = nullptr;    // (N, F) row stride h3_row_stride
  int N = 0, F = 0;
  int64_t dh1_row_stride = 0, dh3_row_stride = 0, dout_row_stride = 0, h1_row_stride = 0, h3_row_stride = 0;
};

void swiglu_backward_cuda(const SwigluBackwardParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
