// The bf16 path's causal attention: ops_cpu.h's attention_forward/backward by the same blocked
// algorithm (attention_blocks.h) with the softmax rows on AVX-512 (avx512.h) and the per-head
// products either
//   kBf16  on oneDNN's bf16 matmul (AMX): q, k, v, dO, P and dS rounded to bf16, fp32 accumulation,
//          softmax, statistics and D in fp32 (PyTorch's bf16 autocast rounds the same operands of its
//          batched products), or
//   kFp32  on oneDNN's fp32 sgemm (JIT AVX-512 kernels on every CPU the bf16 path runs on, where a
//          BLAS may fall back to old kernels on a CPU it does not know).
// kAuto picks kBf16 where oneDNN has AMX, else kFp32 (oneDNN's bf16 products without AMX are
// slower than its fp32 ones).
#pragma once
#include <cstdint>

namespace lt::cpu {

enum class AttentionProducts { kAuto, kFp32, kBf16 };

void attention_forward_onednn(float* out /*(B,T,H,hd)*/, float* lse /*(B,H,T)*/, const float* q /*(B,T,H,hd)*/,
                              const float* k /*(B,T,KVH,hd)*/, const float* v /*(B,T,KVH,hd)*/,
                              const int32_t* seg_start /*(B,T)*/, int B, int Tn, int H, int KVH, int hd,
                              AttentionProducts products = AttentionProducts::kAuto);
void attention_backward_onednn(float* dq /*(B,T,H,hd) =*/, float* dk /*(B,T,KVH,hd) =*/,
                               float* dv /*(B,T,KVH,hd) =*/, const float* dout /*(B,T,H,hd)*/,
                               const float* out /*(B,T,H,hd)*/, const float* lse /*(B,H,T)*/, const float* q,
                               const float* k, const float* v, const int32_t* seg_start, int B, int Tn, int H,
                               int KVH, int hd, AttentionProducts products = AttentionProducts::kAuto);

}  // namespace lt::cpu
