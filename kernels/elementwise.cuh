// Element-wise ops on the device, the twins of lt::cpu::residual_add (include/llamatrain/ops_cpu.h).
// Storage bf16, math fp32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

// out[i] = bf16(float(a[i]) + float(b[i])) for i < n; out may alias a or b (each element is read
// before it is written, by the same thread).
void residual_add_cuda(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n,
                       cudaStream_t stream);

LT_CUDA_NAMESPACE_END
