// Row-major GEMM on the CPU backend's scalar types, so templates over T pick cblas_sgemm or
// cblas_dgemm by overload. Only the CPU backend's .cpp files include this header.
//
// C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C, all row-major with leading dimensions
// lda, ldb, ldc. OpenBLAS's OpenMP build runs single-threaded when called from inside one of our
// `omp parallel` regions, so per-head GEMMs in attention do not oversubscribe the cores; called
// outside a parallel region it uses all OpenMP threads.
#pragma once
#include <cblas.h>

namespace lt::cpu::blas {

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace lt::cpu::blas
