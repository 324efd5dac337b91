// Element-wise ops on the device, the twins of lt::cpu::residual_add and lt::cpu::dropout
// (include/llamatrain/ops_cpu.h). Storage bf16, math fp32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

// out[i] = bf16(float(a[i]) + float(b[i])) for i < n; out may alias a or b (each element is read
// before it is written, by the same thread).
void residual_add_cuda(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n,
                       cudaStream_t stream);

// LoRA's inverted dropout: out[i] = bf16(float(x[i]) * (1 / (1 - p))) where element i is kept, else
// 0; element i is dropped when mix64(mix64(stream) + i) >> 11, as a fraction of 2^53, is below p:
// the CPU's rule, so both drop the same elements. out may alias x.
void dropout_cuda(__nv_bfloat16* out, const __nv_bfloat16* x, size_t n, float p, uint64_t stream,
                  cudaStream_t cuda_stream);

LT_CUDA_NAMESPACE_END
