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
