// RMSNorm forward/backward on the device (Llama 2: no mean subtraction, no bias), the twin of
// lt::cpu::rmsnorm_forward / rmsnorm_backward in include/llamatrain/ops_cpu.h.
// Storage bf16, accumulation fp32, the rstd cache fp32. Rows are N = B*T tokens; every row
// pointer advances by its own row stride (elements), so a row may be padded or a view.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

struct RmsnormForwardParams {
  __nv_bfloat16* out = nullptr;          // (N, C) row stride out_row_stride
  float* rstd = nullptr;                 // (N) 1 / sqrt(mean(x^2) + eps), kept for backward
  const __nv_bfloat16* x = nullptr;      // (N, C) row stride x_row_stride
  const __nv_bfloat16* weight = nullptr; // (C)
  int N = 0, C = 0;
  int64_t x_row_stride = 0, out_row_stride = 0;
  float eps = 1e-5f;
};

// out = x * rstd * weight.
void rmsnorm_forward_cuda(const RmsnormForwardParams& p, cudaStream_t stream);

struct RmsnormBackwardParams {
  __nv_bfloat16* dx = nullptr;           // (N, C) =, row stride dx_row_stride
  float* dweight = nullptr;              // (C) +=; null: not computed (a frozen weight)
  float* scratch = nullptr;              // rmsnorm_backward_scratch_floats(N, C) floats
  const __nv_bfloat16* dout = nullptr;   // (N, C) row stride dout_row_stride
  const __nv_bfloat16* x = nullptr;      // (N, C) row stride x_row_stride
  const __nv_bfloat16* weight = nullptr; // (C)
  const float* rstd = nullptr;           // (N) from the forward pass
  int N = 0, C = 0;
  int64_t dx_row_stride = 0, dout_row_stride = 0, x_row_stride = 0;
};

// dx = rstd w g - x rstd^3 (1/C) sum_k w_k g_k x_k (=); dweight += sum_rows g x rstd (+=), summed
// in a fixed order (per-chunk partials in scratch, then chunks in index order), so the result
// does not depend on scheduling.
void rmsnorm_backward_cuda(const RmsnormBackwardParams& p, cudaStream_t stream);
size_t rmsnorm_backward_scratch_floats(int N, int C);

LT_CUDA_NAMESPACE_END
