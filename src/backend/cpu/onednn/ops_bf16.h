// The CPU ops of the bf16 path that write a bf16 copy of their output in the same loop as the fp32
// one (or only the bf16 one), so the matrix products that read it need no conversion pass of
// their own, and the fp32 ops it runs on AVX-512. Same formulas and argument order as ops_cpu.h;
// the bf16 outputs are rounded to nearest even (bf16.h). Each runs on AVX-512 (avx512.h: exp by a
// polynomial, 2 ulp) where the CPU has it, else as its scalar twin in ops_bf16.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/onednn/bf16.h"

namespace lt::cpu {

// rmsnorm_forward, with out also written as bf16.
void rmsnorm_forward_bf16(float* out /*(N,C)*/, bf16* out_bf16 /*(N,C)*/, float* rstd /*(N)*/,
                          const float* x /*(N,C)*/, const float* w /*(C)*/, int N, int C, float eps);
// rmsnorm_backward (ops_cpu.h) on AVX-512.
void rmsnorm_backward_avx512(float* dx /*(N,C) =*/, float* dw /*(C) +=*/, const float* dout /*(N,C)*/,
                             const float* x /*(N,C)*/, const float* w /*(C)*/, const float* rstd /*(N)*/, int N,
                             int C);
// rope_forward / rope_backward (ops_cpu.h) on AVX-512, the angles' cos and sin computed once per
// position instead of once per row (out may alias x).
void rope_forward_avx512(float* out /*(B,T,H,hd)*/, const float* x /*(B,T,H,hd)*/, const int32_t* pos /*(B,T)*/,
                         int B, int Tn, int H, int hd, float theta);
void rope_backward_avx512(float* dx /*(B,T,H,hd) =*/, const float* dout /*(B,T,H,hd)*/, const int32_t* pos, int B,
                          int Tn, int H, int hd, float theta);
// residual_add (ops_cpu.h) on AVX-512: out = a + b.
void residual_add_avx512(float* out, const float* a, const float* b, size_t n);
// swiglu_forward, with out also written as bf16.
void swiglu_forward_bf16(float* out /*(N,F)*/, bf16* out_bf16 /*(N,F)*/, const float* h1 /*(N,F)*/,
                         const float* h3 /*(N,F)*/, int N, int F);
// swiglu_backward writing dh1 and dh3 in bf16 only (they feed only the w1 and w3 products).
void swiglu_backward_bf16(bf16* dh1 /*(N,F) =*/, bf16* dh3 /*(N,F) =*/, const float* dout /*(N,F)*/,
                          const float* h1, const float* h3, int N, int F);
// crossentropy_forward that also keeps e = exp(logits - row max) in bf16 (the exp it computes for the
// log-sum-exp anyway), the row maxima and the targets' logits (0 on masked rows), so that the
// backward needs no second exp pass and no logits.
double crossentropy_forward_bf16(float* losses /*(N)*/, float* lse /*(N)*/, bf16* e /*(N,V)*/,
                                 float* row_max /*(N)*/, float* target_logit /*(N)*/, const float* logits /*(N,V)*/,
                                 const int32_t* targets, const uint8_t* mask, int N, int V);
// The same from bf16 logits, e written in their place.
double crossentropy_forward_from_bf16(float* losses /*(N)*/, float* lse /*(N)*/,
                                      bf16* logits_e /*(N,V) in: logits, out: e*/, float* row_max /*(N)*/,
                                      float* target_logit /*(N)*/, const int32_t* targets, const uint8_t* mask, int N,
                                      int V);
// crossentropy_backward from that forward's e, in place: dlogits = dloss (e exp(max - lse) - [j == t]),
// the target's probability from its kept fp32 logit.
void crossentropy_backward_from_exp_bf16(bf16* dlogits_e /*(N,V) in: e, out: dlogits*/,
                                         const float* target_logit /*(N)*/, const float* lse /*(N)*/,
                                         const float* row_max /*(N)*/, const int32_t* targets,
                                         const uint8_t* mask, float dloss, int N, int V);
// crossentropy_backward writing dlogits in bf16 only (it feeds only the output head's products).
void crossentropy_backward_bf16(bf16* dlogits /*(N,V) =*/, const float* logits /*(N,V)*/,
                                const float* lse /*(N)*/, const int32_t* targets, const uint8_t* mask,
                                float dloss, int N, int V);

}  // namespace lt::cpu
