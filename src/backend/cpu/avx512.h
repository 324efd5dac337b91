// AVX-512 building blocks of the bf16 path's element-wise ops and attention (onednn/ops_bf16.cpp,
// onednn/attention_onednn.cpp) and of the AdamW step. The bf16 path runs only where oneDNN has bf16
// products, which needs AVX-512 (Bf16Matmuls refuses any other CPU), so these functions are compiled
// for AVX-512 with a target attribute while the rest of the binary stays at the x86-64 baseline; the
// public entry points check the CPU (has_avx512()) and fall back to their scalar twins.
//
// Only functions marked LT_AVX512 may call the helpers below (GCC inlines a helper only into a
// caller whose target includes the helper's).
#pragma once
// GCC 12 warns inside its own AVX-512 headers (the reductions' _mm512_undefined_* are "maybe
// uninitialized"); the pragma must come before the headers' first inclusion.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/onednn/bf16.h"

#define LT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

namespace lt::cpu::avx512 {

// AVX-512 F, BW, VL and DQ (oneDNN's avx512_core), checked once.
inline bool has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok;
}

// Mask of the first n (< 16) lanes, for a loop's tail.
LT_AVX512 inline __mmask16 tail_mask(std::ptrdiff_t n) { return __mmask16((1u << n) - 1u); }

// exp(x) for 16 lanes: x = n ln2 + r with |r| <= ln2/2, exp(r) by Cephes' expf polynomial (relative
// error ~1e-7, 2 ulp), times 2^n by scalef. Below -104 the result is 0 (2^-150 rounds to 0), above
// 88.7 it is +inf; NaN stays NaN.
LT_AVX512 inline __m512 exp(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.8f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512 y = _mm512_scalef_ps(p, n);
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  // NaN in, NaN out
}

// 1 / (1 + exp(-x)).
LT_AVX512 inline __m512 sigmoid(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// 16 floats to bf16, rounded to nearest even, NaN kept quiet: float_to_bf16 (bf16.h) lane by lane.
LT_AVX512 inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

LT_AVX512 inline void store_bf16(bf16* p, __m512 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }
LT_AVX512 inline void store_bf16(bf16* p, __m512 x, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, to_bf16(x)); }

LT_AVX512 inline __m512 load_bf16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
LT_AVX512 inline __m512 load_bf16(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace lt::cpu::avx512
