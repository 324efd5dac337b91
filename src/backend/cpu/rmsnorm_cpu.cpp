// RMSNorm forward/backward on the CPU (Llama 2: no mean subtraction, no bias).
#include <algorithm>
#include <cmath>

#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// Columns per dw task in the backward pass; the per-column sums live on the stack in double.
constexpr int kRmsnormColumnBlock = 256;

}  // namespace

// rstd = 1 / sqrt(mean(x^2) + eps), out = x * rstd * w. The sum of squares is accumulated in double
// so rstd is correctly rounded for float even when C is large.
template <class T>
void rmsnorm_forward(T* out /*(N,C)*/, T* rstd /*(N)*/, const T* x /*(N,C)*/, const T* w /*(C)*/,
                     int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* xi = x + static_cast<size_t>(i) * C;
    T* oi = out + static_cast<size_t>(i) * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(xi[c]) * xi[c];
    const T r = static_cast<T>(1.0 / std::sqrt(ss / C + static_cast<double>(eps)));
    rstd[i] = r;
    for (int c = 0; c < C; ++c) oi[c] = xi[c] * r * w[c];
  }
}

// With y_j = x_j r w_j and r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so
//   dx_j = r w_j g_j - x_j r^3 (1/C) sum_k w_k g_k x_k
//   dw_j += sum_rows g_j x_j r
// dx is parallel over rows; dw is parallel over column blocks, each summing its rows in index
// order, so dw is the same for any thread count.
template <class T>
void rmsnorm_backward(T* dx /*(N,C) =*/, T* dw /*(C) +=*/, const T* dout /*(N,C)*/,
                      const T* x /*(N,C)*/, const T* w /*(C)*/, const T* rstd /*(N)*/, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* xi = x + static_cast<size_t>(i) * C;
    const T* gi = dout + static_cast<size_t>(i) * C;
    T* dxi = dx + static_cast<size_t>(i) * C;
    double dot = 0.0;  // sum_k w_k g_k x_k
    for (int c = 0; c < C; ++c) dot += static_cast<double>(w[c]) * gi[c] * xi[c];
    const double r = rstd[i];
    const T a = static_cast<T>(r);
    const T b = static_cast<T>(r * r * r * dot / C);
    for (int c = 0; c < C; ++c) dxi[c] = a * w[c] * gi[c] - b * xi[c];
  }

  if (!dw) return;  // a frozen weight
  const int n_blocks = (C + kRmsnormColumnBlock - 1) / kRmsnormColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int c0 = blk * kRmsnormColumnBlock;
    const int c1 = std::min(C, c0 + kRmsnormColumnBlock);
    double acc[kRmsnormColumnBlock] = {};
    for (int i = 0; i < N; ++i) {
      const T* xi = x + static_cast<size_t>(i) * C;
      const T* gi = dout + static_cast<size_t>(i) * C;
      const double r = rstd[i];
      for (int c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(gi[c]) * xi[c] * r;
    }
    for (int c = c0; c < c1; ++c) dw[c] += static_cast<T>(acc[c - c0]);
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int,
                                      float);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int, int);

}  // namespace lt::cpu
