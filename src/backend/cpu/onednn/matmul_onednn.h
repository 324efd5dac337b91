// Matrix products with bf16 operands and fp32 accumulation and output, through oneDNN's matmul
// primitive (on AMX tiles where the CPU has them: oneDNN picks the kernel and asks the kernel for
// AMX permission itself). The bf16 CPU path's one entry point to oneDNN.
//
// C (M,N) = op(A) (M,K) op(B) (K,N) (+ C when accumulate), row-major with leading dimensions
// lda, ldb, ldc, the same argument convention as blas.h's gemm. A primitive is created once per
// (shape, transposes, leading dimensions, accumulate) and kept in a per-thread cache, so a
// training step creates none in its steady state.
#pragma once
#include <string>

#include "backend/cpu/onednn/bf16.h"

namespace lt::cpu::onednn {

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda, const bf16* B,
               int ldb, bool accumulate, float* C, int ldc);

// The same product rounded to bf16 on output (fp32 accumulation inside), no accumulation.
void gemm_bf16_out_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda, const bf16* B,
                        int ldb, bf16* C, int ldc);

// Products with a packed B: op(B) (K,N) rounded to bf16 and laid out the way oneDNN's kernel for
// C (M,N) = A (M,K) B (K,N) reads it (the matmul's weights in format "any"), so that a product does
// not copy B into that layout itself on every call: a weight read by several products between two
// optimizer steps is packed once per step, the fp32 -> bf16 rounding in the same pass. A and C are
// contiguous (lda K, ldc N); a packing is valid for products of the same M, N, K and output type.
// The bytes of a packed B (for products writing bf16 when c_bf16).
size_t gemm_bf16_packed_bytes(int M, int N, int K, bool c_bf16);
// Bp = op(B) from fp32 B, row-major with leading dimension ldb (op transposes when trans_b).
void gemm_bf16_pack(void* Bp, bool trans_b, int M, int N, int K, const float* B, int ldb, bool c_bf16);
// C = A Bp, fp32 output; and the same rounded to bf16 (Bp packed with c_bf16).
void gemm_bf16_packed(int M, int N, int K, const bf16* A, const void* Bp, float* C);
void gemm_bf16_packed_out_bf16(int M, int N, int K, const bf16* A, const void* Bp, bf16* C);

// Primitives created so far on this thread (the cache's size), for tests.
size_t gemm_bf16_cached_primitives();
// The oneDNN implementation of the last product on this thread, e.g. "brg:avx512_core_amx_bf16".
std::string gemm_bf16_last_impl();

// The functions below load oneDNN on first use and throw lt::Error when it cannot be loaded
// (onednn_library.h).
// The instruction set oneDNN dispatches to on this CPU, e.g. "avx512_core_amx (AMX bf16 tiles)".
std::string effective_isa();
// Whether that ISA includes AMX: without it oneDNN's bf16 products are slower than fp32 BLAS.
bool has_amx();
// Whether oneDNN has bf16 products at all on that ISA (oneDNN 2.x: AVX-512 and later, not AVX2).
bool has_bf16_matmul();
// oneDNN's version, e.g. "2.6.3".
std::string version();

}  // namespace lt::cpu::onednn
