// Causal attention on the CPU backend: the blocked algorithm of attention_blocks.h over OpenBLAS
// products and scalar row loops, the reference every other attention is tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_blocks.h"
#include "backend/cpu/blas.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

template <class T>
struct BlasKernels {
  static void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                   int ldb, T beta, T* C, int ldc) {
    blas::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  static T softmax_row(T* row, int j0, int j1, int n) {
    T mx = row[j0];
    for (int j = j0 + 1; j < j1; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int j = j0; j < j1; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (int j = 0; j < j0; ++j) row[j] = T(0);
    for (int j = j0; j < j1; ++j) row[j] *= inv;
    for (int j = j1; j < n; ++j) row[j] = T(0);
    return static_cast<T>(static_cast<double>(mx) + std::log(sum));
  }
  static void probability_row(T* row, int j0, int j1, int n, T lse) {
    for (int j = 0; j < j0; ++j) row[j] = T(0);
    for (int j = j0; j < j1; ++j) row[j] = std::exp(row[j] - lse);
    for (int j = j1; j < n; ++j) row[j] = T(0);
  }
  static void ds_row(T* ds, const T* p, T d, int n) {
    for (int j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - d);
  }
};

}  // namespace

template <class T>
void attention_forward(T* out /*(B,T,H,hd)*/, T* lse /*(B,H,T)*/, const T* q /*(B,T,H,hd)*/,
                       const T* k /*(B,T,KVH,hd)*/, const T* v /*(B,T,KVH,hd)*/,
                       const int32_t* seg_start /*(B,T)*/, int B, int Tn, int H, int KVH, int hd) {
  attention_forward_blocks<T, BlasKernels<T>>(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}

template <class T>
void attention_backward(T* dq /*(B,T,H,hd) =*/, T* dk /*(B,T,KVH,hd) =*/, T* dv /*(B,T,KVH,hd) =*/,
                        const T* dout /*(B,T,H,hd)*/, const T* out /*(B,T,H,hd)*/,
                        const T* lse /*(B,H,T)*/, const T* q, const T* k, const T* v,
                        const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  attention_backward_blocks<T, BlasKernels<T>>(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}

template <class T>
void attention_decode(T* out, const T* q, const T* k, const T* v, int64_t kv_stride, int n, int H, int KVH, int hd) {
  const T scale = T(1) / std::sqrt(T(hd));
  const int group = H / KVH;
  std::vector<T> scores(static_cast<size_t>(n));
  for (int h = 0; h < H; ++h) {
    const T* qh = q + size_t(h) * hd;
    const size_t kv = size_t(h / group) * hd;
    T mx = -INFINITY;
    for (int s = 0; s < n; ++s) {
      const T* ks = k + s * kv_stride + kv;
      T dot = 0;
      for (int i = 0; i < hd; ++i) dot += qh[i] * ks[i];
      scores[size_t(s)] = dot * scale;
      mx = std::max(mx, scores[size_t(s)]);
    }
    T sum = 0;
    for (int s = 0; s < n; ++s) sum += (scores[size_t(s)] = std::exp(scores[size_t(s)] - mx));
    T* o = out + size_t(h) * hd;
    std::fill(o, o + hd, T(0));
    for (int s = 0; s < n; ++s) {
      const T p = scores[size_t(s)] / sum;
      const T* vs = v + s * kv_stride + kv;
      for (int i = 0; i < hd; ++i) o[i] += p * vs[i];
    }
  }
}

template void attention_decode<float>(float*, const float*, const float*, const float*, int64_t, int, int, int, int);
template void attention_decode<double>(double*, const double*, const double*, const double*, int64_t, int, int, int,
                                       int);
template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const int32_t*, int, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, const double*,
                                        const double*, const int32_t*, int, int, int, int, int);
template void attention_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const int32_t*, int, int, int, int, int);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*,
                                         const double*, const int32_t*, int, int, int, int, int);

}  // namespace lt::cpu
