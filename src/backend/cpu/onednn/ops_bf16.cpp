// The fused bf16-writing ops (ops_bf16.h); the formulas are those of rmsnorm_cpu.cpp,
// elementwise_cpu.cpp and crossentropy_cpu.cpp.
#include "backend/cpu/avx512.h"  // first: its pragma precedes <immintrin.h>
#include "backend/cpu/onednn/ops_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/aligned_allocator.h"
#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// The scalar twins: the formulas of the AVX-512 versions below, one element at a time (CPUs
// without AVX-512 never reach the bf16 path; they are kept as the readable reference and fallback).

void rmsnorm_forward_bf16_scalar(float* out, bf16* out_bf16, float* rstd, const float* x, const float* w, int N, int C,
                          float eps) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* xi = x + size_t(i) * C;
    float* oi = out + size_t(i) * C;
    bf16* bi = out_bf16 + size_t(i) * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += double(xi[c]) * xi[c];
    const float r = float(1.0 / std::sqrt(ss / C + double(eps)));
    rstd[i] = r;
    for (int c = 0; c < C; ++c) {
      oi[c] = xi[c] * r * w[c];
      bi[c] = float_to_bf16(oi[c]);
    }
  }
}

void swiglu_forward_bf16_scalar(float* out, bf16* out_bf16, const float* h1, const float* h3, int N, int F) {
  const std::ptrdiff_t n = std::ptrdiff_t(N) * F;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const float a = h1[i];
    out[i] = a / (1.0f + std::exp(-a)) * h3[i];
    out_bf16[i] = float_to_bf16(out[i]);
  }
}

void swiglu_backward_bf16_scalar(bf16* dh1, bf16* dh3, const float* dout, const float* h1, const float* h3, int N,
                          int F) {
  const std::ptrdiff_t n = std::ptrdiff_t(N) * F;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const float a = h1[i], b = h3[i], g = dout[i];
    const float s = 1.0f / (1.0f + std::exp(-a));
    dh1[i] = float_to_bf16(g * b * s * (1.0f + a * (1.0f - s)));
    dh3[i] = float_to_bf16(g * a * s);
  }
}

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return bf16_to_float(x); }

// Logits of type L: fp32, or bf16 (then e may alias them: each element is read before it is written).
template <class L>
double crossentropy_forward_bf16_scalar(float* losses, float* lse, bf16* e, float* row_max, float* target_logit,
                                        const L* logits, const int32_t* targets, const uint8_t* mask, int N, int V) {
  std::vector<double> row_loss(size_t(N > 0 ? N : 0));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const L* li = logits + size_t(i) * V;
    bf16* ei = e + size_t(i) * V;
    const bool counted = !mask || mask[i];
    const float lt = counted ? to_float(li[targets[i]]) : 0.0f;
    float m = to_float(li[0]);
    for (int j = 1; j < V; ++j) m = to_float(li[j]) > m ? to_float(li[j]) : m;
    double sum = 0.0;
    for (int j = 0; j < V; ++j) {
      const float x = std::exp(to_float(li[j]) - m);
      sum += x;
      ei[j] = float_to_bf16(x);
    }
    const double row_lse = double(m) + std::log(sum);
    row_max[i] = m;
    lse[i] = float(row_lse);
    target_logit[i] = lt;
    row_loss[size_t(i)] = counted ? (row_lse - lt) * (mask ? mask[i] : 1) : 0.0;  // its weight
    losses[i] = float(row_loss[size_t(i)]);
  }
  double total = 0.0;
  for (int i = 0; i < N; ++i) total += row_loss[size_t(i)];
  return total;
}

void crossentropy_backward_from_exp_bf16_scalar(bf16* dlogits_e, const float* target_logit, const float* lse,
                                         const float* row_max, const int32_t* targets, const uint8_t* mask,
                                         float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    bf16* di = dlogits_e + size_t(i) * V;
    if (mask && !mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = 0;
      continue;
    }
    const float g = mask ? dloss * float(mask[i]) : dloss;  // the token's weight
    const float scale = g * std::exp(row_max[i] - lse[i]);  // dloss / sum_j exp(l_ij - max)
    for (int j = 0; j < V; ++j) di[j] = float_to_bf16(bf16_to_float(di[j]) * scale);
    const int t = targets[i];
    di[t] = float_to_bf16(g * (std::exp(target_logit[i] - lse[i]) - 1.0f));
  }
}

void crossentropy_backward_bf16_scalar(bf16* dlogits, const float* logits, const float* lse, const int32_t* targets,
                                const uint8_t* mask, float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* li = logits + size_t(i) * V;
    bf16* di = dlogits + size_t(i) * V;
    if (mask && !mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = 0;
      continue;
    }
    const float row_lse = lse[i];
    const int t = targets[i];
    const float g = mask ? dloss * float(mask[i]) : dloss;  // the token's weight
    for (int j = 0; j < V; ++j) {
      const float p = std::exp(li[j] - row_lse);
      di[j] = float_to_bf16(g * (j == t ? p - 1.0f : p));
    }
  }
}

// ---- AVX-512 versions -------------------------------------------------------------------------

// Sum of the 16 lanes' squares into two double accumulators (the fp32 reference sums in double).
LT_AVX512 inline void add_squares(__m512d& a, __m512d& b, __m512 x) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
  a = _mm512_fmadd_pd(lo, lo, a);
  b = _mm512_fmadd_pd(hi, hi, b);
}
LT_AVX512 inline void add_lanes(__m512d& a, __m512d& b, __m512 x) {
  a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
  b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)));
}

LT_AVX512 void rmsnorm_forward_bf16_avx512(float* out, bf16* out_bf16, float* rstd, const float* x, const float* w,
                                           int N, int C, float eps) {
  const int C16 = C & ~15;
  const __mmask16 mt = avx512::tail_mask(C - C16);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* xi = x + size_t(i) * C;
    float* oi = out + size_t(i) * C;
    bf16* bi = out_bf16 + size_t(i) * C;
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int c = 0; c < C16; c += 16) add_squares(s0, s1, _mm512_loadu_ps(xi + c));
    if (mt) add_squares(s0, s1, _mm512_maskz_loadu_ps(mt, xi + C16));
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    const float r = float(1.0 / std::sqrt(ss / C + double(eps)));
    rstd[i] = r;
    const __m512 rv = _mm512_set1_ps(r);
    for (int c = 0; c < C16; c += 16) {
      const __m512 o = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xi + c), rv), _mm512_loadu_ps(w + c));
      _mm512_storeu_ps(oi + c, o);
      avx512::store_bf16(bi + c, o);
    }
    if (mt) {
      const __m512 o = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mt, xi + C16), rv),
                                     _mm512_maskz_loadu_ps(mt, w + C16));
      _mm512_mask_storeu_ps(oi + C16, mt, o);
      avx512::store_bf16(bi + C16, o, mt);
    }
  }
}

// dx_j = r w_j g_j - x_j r^3 (1/C) sum_k w_k g_k x_k; dw_j += sum_rows g_j x_j r (rmsnorm_cpu.cpp),
// the dot products and the dw column sums in double.
LT_AVX512 void rmsnorm_backward_avx512_impl(float* dx, float* dw, const float* dout, const float* x, const float* w,
                                            const float* rstd, int N, int C) {
  const int C16 = C & ~15;
  const __mmask16 mt = avx512::tail_mask(C - C16);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* xi = x + size_t(i) * C;
    const float* gi = dout + size_t(i) * C;
    float* dxi = dx + size_t(i) * C;
    __m512d d0 = _mm512_setzero_pd(), d1 = _mm512_setzero_pd();
    for (int c = 0; c < C16; c += 16)
      add_lanes(d0, d1, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(w + c), _mm512_loadu_ps(gi + c)),
                                      _mm512_loadu_ps(xi + c)));
    if (mt)
      add_lanes(d0, d1, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mt, w + C16), _mm512_maskz_loadu_ps(mt, gi + C16)),
                                      _mm512_maskz_loadu_ps(mt, xi + C16)));
    const double dot = _mm512_reduce_add_pd(_mm512_add_pd(d0, d1));
    const double r = rstd[i];
    const __m512 a = _mm512_set1_ps(float(r)), b = _mm512_set1_ps(float(r * r * r * dot / C));
    for (int c = 0; c < C16; c += 16) {
      const __m512 awg = _mm512_mul_ps(_mm512_mul_ps(a, _mm512_loadu_ps(w + c)), _mm512_loadu_ps(gi + c));
      _mm512_storeu_ps(dxi + c, _mm512_fnmadd_ps(b, _mm512_loadu_ps(xi + c), awg));
    }
    if (mt) {
      const __m512 awg = _mm512_mul_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(mt, w + C16)), _mm512_maskz_loadu_ps(mt, gi + C16));
      _mm512_mask_storeu_ps(dxi + C16, mt, _mm512_fnmadd_ps(b, _mm512_maskz_loadu_ps(mt, xi + C16), awg));
    }
  }
  // dw: column blocks of 16 summed over the rows in index order (the same for any thread count).
  const int n_blocks = (C + 15) / 16;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int c0 = blk * 16;
    const __mmask16 m = C - c0 >= 16 ? __mmask16(0xffff) : avx512::tail_mask(C - c0);
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int i = 0; i < N; ++i) {
      const __m512 gx = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dout + size_t(i) * C + c0),
                                      _mm512_maskz_loadu_ps(m, x + size_t(i) * C + c0));
      const __m512d r = _mm512_set1_pd(rstd[i]);
      a0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(gx)), r, a0);
      a1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(gx, 1)), r, a1);
    }
    const __m512 sum = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(a0)), _mm512_cvtpd_ps(a1), 1);
    _mm512_mask_storeu_ps(dw + c0, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dw + c0), sum));
  }
}

LT_AVX512 void swiglu_forward_bf16_avx512(float* out, bf16* out_bf16, const float* h1, const float* h3, int N, int F) {
  const std::ptrdiff_t n = std::ptrdiff_t(N) * F, n16 = n & ~std::ptrdiff_t(15);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n16; i += 16) {
    const __m512 a = _mm512_loadu_ps(h1 + i);
    const __m512 o = _mm512_mul_ps(_mm512_mul_ps(a, avx512::sigmoid(a)), _mm512_loadu_ps(h3 + i));
    _mm512_storeu_ps(out + i, o);
    avx512::store_bf16(out_bf16 + i, o);
  }
  if (n16 < n) {
    const __mmask16 m = avx512::tail_mask(n - n16);
    const __m512 a = _mm512_maskz_loadu_ps(m, h1 + n16);
    const __m512 o = _mm512_mul_ps(_mm512_mul_ps(a, avx512::sigmoid(a)), _mm512_maskz_loadu_ps(m, h3 + n16));
    _mm512_mask_storeu_ps(out + n16, m, o);
    avx512::store_bf16(out_bf16 + n16, o, m);
  }
}

LT_AVX512 inline void swiglu_backward_16(bf16* dh1, bf16* dh3, const float* dout, const float* h1, const float* h3,
                                         __mmask16 m) {
  const __m512 a = _mm512_maskz_loadu_ps(m, h1), b = _mm512_maskz_loadu_ps(m, h3), g = _mm512_maskz_loadu_ps(m, dout);
  const __m512 s = avx512::sigmoid(a), one = _mm512_set1_ps(1.0f);
  const __m512 dsilu = _mm512_mul_ps(s, _mm512_fmadd_ps(a, _mm512_sub_ps(one, s), one));  // s (1 + a (1 - s))
  avx512::store_bf16(dh1, _mm512_mul_ps(_mm512_mul_ps(g, b), dsilu), m);
  avx512::store_bf16(dh3, _mm512_mul_ps(_mm512_mul_ps(g, a), s), m);
}

LT_AVX512 void swiglu_backward_bf16_avx512(bf16* dh1, bf16* dh3, const float* dout, const float* h1, const float* h3,
                                           int N, int F) {
  const std::ptrdiff_t n = std::ptrdiff_t(N) * F, n16 = n & ~std::ptrdiff_t(15);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n16; i += 16) swiglu_backward_16(dh1 + i, dh3 + i, dout + i, h1 + i, h3 + i, 0xffff);
  if (n16 < n)
    swiglu_backward_16(dh1 + n16, dh3 + n16, dout + n16, h1 + n16, h3 + n16, avx512::tail_mask(n - n16));
}

LT_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
LT_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
LT_AVX512 inline __m512 load16(const bf16* p) { return avx512::load_bf16(p); }
LT_AVX512 inline __m512 load16(const bf16* p, __mmask16 m) { return avx512::load_bf16(p, m); }

// Row maximum of l (V).
template <class L>
LT_AVX512 inline float row_max_avx512(const L* l, int V) {
  const int V16 = V & ~15;
  __m512 m = _mm512_set1_ps(to_float(l[0]));
  for (int j = 0; j < V16; j += 16) m = _mm512_max_ps(m, load16(l + j));
  if (V16 < V) m = _mm512_mask_max_ps(m, avx512::tail_mask(V - V16), m, load16(l + V16, avx512::tail_mask(V - V16)));
  return _mm512_reduce_max_ps(m);
}

// Logits of type L: fp32, or bf16 (then e may alias them: each vector is read before it is written).
template <class L>
LT_AVX512 void crossentropy_forward_bf16_avx512(float* losses, float* lse, bf16* e, float* row_max, float* target_logit,
                                                const L* logits, const int32_t* targets, const uint8_t* mask,
                                                double* row_loss, int N, int V) {
  const int V16 = V & ~15;
  const __mmask16 mt = avx512::tail_mask(V - V16);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const L* li = logits + size_t(i) * V;
    bf16* ei = e + size_t(i) * V;
    const float lt = mask[i] ? to_float(li[targets[i]]) : 0.0f;
    const float m = row_max_avx512(li, V);
    const __m512 mv = _mm512_set1_ps(m);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int j = 0; j < V16; j += 16) {
      const __m512 x = avx512::exp(_mm512_sub_ps(load16(li + j), mv));
      add_lanes(s0, s1, x);
      avx512::store_bf16(ei + j, x);
    }
    if (mt) {
      const __m512 x = _mm512_maskz_mov_ps(mt, avx512::exp(_mm512_sub_ps(load16(li + V16, mt), mv)));
      add_lanes(s0, s1, x);
      avx512::store_bf16(ei + V16, x, mt);
    }
    const double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    const double row_lse = double(m) + std::log(sum);
    row_max[i] = m;
    lse[i] = float(row_lse);
    target_logit[i] = lt;
    row_loss[i] = mask[i] ? (row_lse - lt) * mask[i] : 0.0;  // its weight
    losses[i] = float(row_loss[i]);
  }
}

LT_AVX512 void crossentropy_backward_from_exp_bf16_avx512(bf16* dlogits_e, const float* target_logit, const float* lse,
                                                          const float* row_max, const int32_t* targets,
                                                          const uint8_t* mask, float dloss, int N, int V) {
  const int V16 = V & ~15;
  const __mmask16 mt = avx512::tail_mask(V - V16);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    bf16* di = dlogits_e + size_t(i) * V;
    if (!mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = 0;
      continue;
    }
    const __m512 scale = _mm512_set1_ps(dloss * float(mask[i]) * std::exp(row_max[i] - lse[i]));  // dloss / sum_j exp(l_ij - max)
    for (int j = 0; j < V16; j += 16) avx512::store_bf16(di + j, _mm512_mul_ps(avx512::load_bf16(di + j), scale));
    if (mt) avx512::store_bf16(di + V16, _mm512_mul_ps(avx512::load_bf16(di + V16, mt), scale), mt);
    const int t = targets[i];
    di[t] = float_to_bf16(dloss * float(mask[i]) * (std::exp(target_logit[i] - lse[i]) - 1.0f));
  }
}

LT_AVX512 void crossentropy_backward_bf16_avx512(bf16* dlogits, const float* logits, const float* lse,
                                                 const int32_t* targets, const uint8_t* mask, float dloss, int N,
                                                 int V) {
  const int V16 = V & ~15;
  const __mmask16 mt = avx512::tail_mask(V - V16);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* li = logits + size_t(i) * V;
    bf16* di = dlogits + size_t(i) * V;
    if (!mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = 0;
      continue;
    }
    const __m512 l = _mm512_set1_ps(lse[i]), g = _mm512_set1_ps(dloss * float(mask[i]));
    for (int j = 0; j < V16; j += 16)
      avx512::store_bf16(di + j, _mm512_mul_ps(g, avx512::exp(_mm512_sub_ps(_mm512_loadu_ps(li + j), l))));
    if (mt)
      avx512::store_bf16(di + V16, _mm512_mul_ps(g, avx512::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mt, li + V16), l))), mt);
    const int t = targets[i];
    di[t] = float_to_bf16(dloss * float(mask[i]) * (std::exp(li[t] - lse[i]) - 1.0f));
  }
}

LT_AVX512 void residual_add_avx512_impl(float* out, const float* a, const float* b, size_t n) {
  const std::ptrdiff_t len = std::ptrdiff_t(n), n16 = len & ~std::ptrdiff_t(15);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n16; i += 16)
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  for (std::ptrdiff_t i = n16; i < len; ++i) out[i] = a[i] + b[i];
}

// RoPE (rope_cpu.cpp's formulas and angles) from a table of the positions' cos and sin, built once
// per call in double as rope_cpu.cpp computes them per row: cs[p][2i] = cs[p][2i+1] = cos(p f_i),
// sn[p][2i] = -sign sin(p f_i), sn[p][2i+1] = sign sin(p f_i), so that with x's pairs swapped
// (x1, x0): out = x cs + swap(x) sn, 16 lanes at a time.
LT_AVX512 void rope_avx512_impl(float* out, const float* x, const int32_t* pos, int B, int Tn, int H, int hd,
                                float theta, double sign, int n_pos) {
  const int rows = B * Tn, half = hd / 2;
  AlignedVector<float> cs(size_t(n_pos) * hd), sn(size_t(n_pos) * hd);
  std::vector<double> freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) freq[size_t(i)] = std::pow(double(theta), -2.0 * i / hd);
#pragma omp parallel for schedule(static)
  for (int p = 0; p < n_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = p * freq[size_t(i)];
      const float c = float(std::cos(angle)), s = float(sign * std::sin(angle));
      const size_t o = size_t(p) * hd + 2 * size_t(i);
      cs[o] = cs[o + 1] = c;
      sn[o] = -s, sn[o + 1] = s;
    }
  const int hd16 = hd & ~15;
  const __mmask16 mt = avx512::tail_mask(hd - hd16);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const int p = pos ? pos[r] : r % Tn;
    const float* c = cs.data() + size_t(p) * hd;
    const float* s = sn.data() + size_t(p) * hd;
    for (int h = 0; h < H; ++h) {
      const size_t off = (size_t(r) * H + h) * hd;
      for (int i = 0; i < hd16; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + off + i);
        const __m512 sw = _mm512_permute_ps(v, 0xB1);  // (x1, x0) in every pair
        _mm512_storeu_ps(out + off + i, _mm512_fmadd_ps(v, _mm512_loadu_ps(c + i), _mm512_mul_ps(sw, _mm512_loadu_ps(s + i))));
      }
      if (mt) {
        const __m512 v = _mm512_maskz_loadu_ps(mt, x + off + hd16);
        const __m512 sw = _mm512_permute_ps(v, 0xB1);
        _mm512_mask_storeu_ps(out + off + hd16, mt,
                              _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(mt, c + hd16),
                                              _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(mt, s + hd16))));
      }
    }
  }
}

// Positions [0, n) that the rows use, or 0 when a table would be larger than computing per row.
int rope_table_size(const int32_t* pos, int B, int Tn) {
  if (!pos) return Tn;
  int mx = 0;
  for (int r = 0; r < B * Tn; ++r) {
    if (pos[r] < 0) return 0;
    mx = std::max(mx, pos[r]);
  }
  return mx < B * Tn ? mx + 1 : 0;
}

void check_targets(const int32_t* targets, const uint8_t* mask, int N, int V) {
  LT_CHECK(N <= 0 || V > 0, "crossentropy: empty vocabulary");
  for (int i = 0; i < N; ++i)
    if ((!mask || mask[i]) && (targets[i] < 0 || targets[i] >= V))
      fail(strcat("crossentropy: target id ", targets[i], " at row ", i, " is outside [0, ", V, ")"));
}

}  // namespace

// ---- entry points: AVX-512 where the CPU has it, else the scalar twin --------------------------

void rmsnorm_forward_bf16(float* out, bf16* out_bf16, float* rstd, const float* x, const float* w, int N, int C,
                          float eps) {
  if (avx512::has_avx512()) return rmsnorm_forward_bf16_avx512(out, out_bf16, rstd, x, w, N, C, eps);
  rmsnorm_forward_bf16_scalar(out, out_bf16, rstd, x, w, N, C, eps);
}

void rmsnorm_backward_avx512(float* dx, float* dw, const float* dout, const float* x, const float* w,
                             const float* rstd, int N, int C) {
  if (avx512::has_avx512()) return rmsnorm_backward_avx512_impl(dx, dw, dout, x, w, rstd, N, C);
  rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
}

void swiglu_forward_bf16(float* out, bf16* out_bf16, const float* h1, const float* h3, int N, int F) {
  if (avx512::has_avx512()) return swiglu_forward_bf16_avx512(out, out_bf16, h1, h3, N, F);
  swiglu_forward_bf16_scalar(out, out_bf16, h1, h3, N, F);
}

void swiglu_backward_bf16(bf16* dh1, bf16* dh3, const float* dout, const float* h1, const float* h3, int N, int F) {
  if (avx512::has_avx512()) return swiglu_backward_bf16_avx512(dh1, dh3, dout, h1, h3, N, F);
  swiglu_backward_bf16_scalar(dh1, dh3, dout, h1, h3, N, F);
}

namespace {

template <class L>
double crossentropy_forward_any(float* losses, float* lse, bf16* e, float* row_max, float* target_logit,
                                const L* logits, const int32_t* targets, const uint8_t* mask, int N, int V) {
  check_targets(targets, mask, N, V);
  if (!avx512::has_avx512() || !mask)
    return crossentropy_forward_bf16_scalar(losses, lse, e, row_max, target_logit, logits, targets, mask, N, V);
  std::vector<double> row_loss(size_t(N > 0 ? N : 0));
  crossentropy_forward_bf16_avx512(losses, lse, e, row_max, target_logit, logits, targets, mask, row_loss.data(), N,
                                   V);
  double total = 0.0;
  for (int i = 0; i < N; ++i) total += row_loss[size_t(i)];
  return total;
}

}  // namespace

double crossentropy_forward_bf16(float* losses, float* lse, bf16* e, float* row_max, float* target_logit,
                                 const float* logits, const int32_t* targets, const uint8_t* mask, int N, int V) {
  return crossentropy_forward_any(losses, lse, e, row_max, target_logit, logits, targets, mask, N, V);
}

double crossentropy_forward_from_bf16(float* losses, float* lse, bf16* logits_e, float* row_max, float* target_logit,
                                      const int32_t* targets, const uint8_t* mask, int N, int V) {
  return crossentropy_forward_any(losses, lse, logits_e, row_max, target_logit, static_cast<const bf16*>(logits_e),
                                  targets, mask, N, V);
}

void crossentropy_backward_from_exp_bf16(bf16* dlogits_e, const float* target_logit, const float* lse,
                                         const float* row_max, const int32_t* targets, const uint8_t* mask,
                                         float dloss, int N, int V) {
  if (avx512::has_avx512() && mask)
    return crossentropy_backward_from_exp_bf16_avx512(dlogits_e, target_logit, lse, row_max, targets, mask, dloss, N,
                                                      V);
  crossentropy_backward_from_exp_bf16_scalar(dlogits_e, target_logit, lse, row_max, targets, mask, dloss, N, V);
}

void crossentropy_backward_bf16(bf16* dlogits, const float* logits, const float* lse, const int32_t* targets,
                                const uint8_t* mask, float dloss, int N, int V) {
  check_targets(targets, mask, N, V);
  if (avx512::has_avx512() && mask)
    return crossentropy_backward_bf16_avx512(dlogits, logits, lse, targets, mask, dloss, N, V);
  crossentropy_backward_bf16_scalar(dlogits, logits, lse, targets, mask, dloss, N, V);
}

void rope_forward_avx512(float* out, const float* x, const int32_t* pos, int B, int Tn, int H, int hd, float theta) {
  const int n_pos = rope_table_size(pos, B, Tn);
  if (!avx512::has_avx512() || hd % 2 != 0 || n_pos == 0) return rope_forward(out, x, pos, B, Tn, H, hd, theta);
  rope_avx512_impl(out, x, pos, B, Tn, H, hd, theta, 1.0, n_pos);
}

void rope_backward_avx512(float* dx, const float* dout, const int32_t* pos, int B, int Tn, int H, int hd,
                          float theta) {
  const int n_pos = rope_table_size(pos, B, Tn);
  if (!avx512::has_avx512() || hd % 2 != 0 || n_pos == 0) return rope_backward(dx, dout, pos, B, Tn, H, hd, theta);
  rope_avx512_impl(dx, dout, pos, B, Tn, H, hd, theta, -1.0, n_pos);
}

void residual_add_avx512(float* out, const float* a, const float* b, size_t n) {
  if (avx512::has_avx512()) return residual_add_avx512_impl(out, a, b, n);
  residual_add(out, a, b, n);
}

}  // namespace lt::cpu
