// Optimizer-side ops on fp32 shards: the AdamW step, the sum of squares behind the global gradient
// norm, and in-place scaling (gradient clipping, 1/token-count).
#include "backend/cpu/avx512.h"  // first: its pragma precedes <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/onednn/bf16.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// Elements per partial sum in sum_squares. The chunking depends only on n, so the result is the
// same for any thread count (an OpenMP reduction would sum in a thread-count-dependent order).
constexpr size_t kSumChunk = 1 << 14;

// adamw_update's loop 16 elements at a time, the same IEEE operations in the same order (no fused
// multiply-adds; sqrt and division are correctly rounded either way), so the result is
// bit-identical to the scalar loop, which the compiler cannot vectorise (std::sqrt may set errno).
// fp-contract=off: GCC would otherwise fuse the intrinsics' multiplies and adds (they are plain
// vector arithmetic to it).
LT_AVX512 __attribute__((optimize("fp-contract=off"))) void adamw_update_avx512(float* param, float* m, float* v, const float* grad, std::ptrdiff_t len,
                                   float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                                   float bc2) {
  const __m512 b1 = _mm512_set1_ps(beta1), b2 = _mm512_set1_ps(beta2), c1 = _mm512_set1_ps(1.0f - beta1),
               c2 = _mm512_set1_ps(1.0f - beta2), vbc1 = _mm512_set1_ps(bc1), vbc2 = _mm512_set1_ps(bc2),
               veps = _mm512_set1_ps(eps), vlr = _mm512_set1_ps(lr), vwd = _mm512_set1_ps(weight_decay);
  const std::ptrdiff_t n16 = len & ~std::ptrdiff_t(15);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n16; i += 16) {
    const __m512 g = _mm512_loadu_ps(grad + i);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(c1, g));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)), _mm512_mul_ps(_mm512_mul_ps(c2, g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 m_hat = _mm512_div_ps(mi, vbc1), v_hat = _mm512_div_ps(vi, vbc2);
    const __m512 p = _mm512_loadu_ps(param + i);
    const __m512 upd = _mm512_add_ps(_mm512_div_ps(m_hat, _mm512_add_ps(_mm512_sqrt_ps(v_hat), veps)), _mm512_mul_ps(vwd, p));
    _mm512_storeu_ps(param + i, _mm512_sub_ps(p, _mm512_mul_ps(vlr, upd)));
  }
  for (std::ptrdiff_t i = n16; i < len; ++i) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] -= lr * (mi / bc1 / (std::sqrt(vi / bc2) + eps) + weight_decay * param[i]);
  }
}

}  // namespace

// AdamW with decoupled weight decay (Loshchilov & Hutter), bias-corrected as in PyTorch:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p)
// The bias corrections are computed once in double. No fused multiply-adds (fp-contract=off, for
// builds with FMA instructions): the CUDA kernel rounds the same operations the same way, so offloaded
// and on-device optimizer state take bit-identical steps.
__attribute__((optimize("fp-contract=off"))) void adamw_update(float* param, float* m, float* v, const float* grad, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
  if (avx512::has_avx512())
    return adamw_update_avx512(param, m, v, grad, len, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
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

void widen_bf16(float* out, const uint16_t* x, size_t n) {
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) out[i] = bf16_to_float(x[i]);
}

void round_to_bf16(uint16_t* out, const float* x, size_t n) {
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) out[i] = float_to_bf16(x[i]);
}

}  // namespace lt::cpu
