// Optimizer-side ops on fp32 shards: the AdamW step, the sum of squares behind the global gradient
// norm, and in-place scaling (gradient clipping, 1/token-count).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// Elements per partial sum in sum_squares. The chunking depends only on n, so the result is the
// same for any thread count (an OpenMP reduction would sum in a thread-count-dependent order).
constexpr size_t kSumChunk = 1 << 14;

}  // namespace

// AdamW with decoupled weight decay (Loshchilov & Hutter), bias-corrected as in PyTorch:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p)
// The bias corrections are computed once in double.
void adamw_update(float* param, float* m, float* v, const float* grad, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / bc1;
    const float v_hat = vi / bc2;
    param[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * param[i]);
  }
}

double sum_squares(const float* x, size_t n) {
  const size_t n_chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(n_chunks);
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n_chunks);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t c = 0; c < len; ++c) {
    const size_t i0 = static_cast<size_t>(c) * kSumChunk;
    const size_t i1 = std::min(n, i0 + kSumChunk);
    double s = 0.0;
    for (size_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[c] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale_inplace(float* x, float s, size_t n) {
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) x[i] *= s;
}

}  // namespace lt::cpu
