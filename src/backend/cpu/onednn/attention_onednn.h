// The bf16 path's causal attention: ops_cpu.h's attention_forward/backward in fp32 (the same
// blocked algorithm, attention_blocks.h) with the per-head products on oneDNN's sgemm instead of
// OpenBLAS (oneDNN's JIT kernels use AVX-512 on every CPU the bf16 path runs on, while a BLAS may
// fall back to older kernels on a CPU it does not know) and the softmax rows on AVX-512 (avx512.h).
// q, k, v stay fp32: the scores keep fp32 inputs, as PyTorch's bf16 autocast keeps softmax in fp32.
#pragma once
#include <cstdint>

namespace lt::cpu {

void attention_forward_onednn(float* out /*(B,T,H,hd)*/, float* lse /*(B,H,T)*/, const float* q /*(B,T,H,hd)*/,
                              const float* k /*(B,T,KVH,hd)*/, const float* v /*(B,T,KVH,hd)*/,
                              const int32_t* seg_start /*(B,T)*/, int B, int Tn, int H, int KVH, int hd);
void attention_backward_onednn(float* dq /*(B,T,H,hd) =*/, float* dk /*(B,T,KVH,hd) =*/,
                               float* dv /*(B,T,KVH,hd) =*/, const float* dout /*(B,T,H,hd)*/,
                               const float* out /*(B,T,H,hd)*/, const float* lse /*(B,H,T)*/, const float* q,
                               const float* k, const float* v, const int32_t* seg_start, int B, int Tn, int H,
                               int KVH, int hd);

}  // namespace lt::cpu
