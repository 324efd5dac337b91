// attention_onednn.h: attention_blocks.h over oneDNN's sgemm and AVX-512 softmax rows.
#include "backend/cpu/avx512.h"  // first: its pragma precedes <immintrin.h>
#include "backend/cpu/onednn/attention_onednn.h"

#include <algorithm>
#include <cmath>

#include "llamatrain/ops_cpu.h"

#if LLAMATRAIN_HAVE_ONEDNN
#include "backend/cpu/attention_blocks.h"
#include "backend/cpu/onednn/onednn_library.h"

namespace lt::cpu {
namespace {

struct OnednnKernels {
  // Row-major, as blas.h; oneDNN runs it on the calling thread inside an OpenMP region.
  static void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) {
    static const auto sgemm = onednn::library().sgemm;
    onednn::check(sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc),
                  "sgemm");
  }

  LT_AVX512 static float softmax_row(float* row, int j0, int j1, int n) {
    __m512 mx = _mm512_set1_ps(row[j0]);
    for (int j = j0; j < j1; j += 16) {
      const __mmask16 m = j1 - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(j1 - j);
      mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, row + j));
    }
    const float row_max = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(row_max);
    __m512 sum = _mm512_setzero_ps();
    for (int j = j0; j < j1; j += 16) {
      const __mmask16 m = j1 - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(j1 - j);
      const __m512 e = _mm512_maskz_mov_ps(m, avx512::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), mv)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(row + j, m, e);
    }
    const double s = _mm512_reduce_add_ps(sum);
    const __m512 inv = _mm512_set1_ps(float(1.0 / s));
    for (int j = j0; j < j1; j += 16) {
      const __mmask16 m = j1 - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(j1 - j);
      _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
    }
    std::fill(row, row + j0, 0.0f);
    std::fill(row + j1, row + n, 0.0f);
    return float(double(row_max) + std::log(s));
  }

  LT_AVX512 static void probability_row(float* row, int j0, int j1, int n, float lse) {
    const __m512 l = _mm512_set1_ps(lse);
    for (int j = j0; j < j1; j += 16) {
      const __mmask16 m = j1 - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(j1 - j);
      _mm512_mask_storeu_ps(row + j, m, avx512::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), l)));
    }
    std::fill(row, row + j0, 0.0f);
    std::fill(row + j1, row + n, 0.0f);
  }

  LT_AVX512 static void ds_row(float* ds, const float* p, float d, int n) {
    const __m512 dv = _mm512_set1_ps(d);
    for (int j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(n - j);
      const __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(m, ds + j), dv));
      _mm512_mask_storeu_ps(ds + j, m, r);
    }
  }
};

}  // namespace

void attention_forward_onednn(float* out, float* lse, const float* q, const float* k, const float* v,
                              const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  if (!avx512::has_avx512()) return attention_forward(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
  attention_forward_blocks<float, OnednnKernels>(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}

void attention_backward_onednn(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  if (!avx512::has_avx512())
    return attention_backward(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
  attention_backward_blocks<float, OnednnKernels>(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH,
                                                  hd);
}

}  // namespace lt::cpu
#else  // without oneDNN's headers (the bf16 path is refused before it gets here): the reference

namespace lt::cpu {
void attention_forward_onednn(float* out, float* lse, const float* q, const float* k, const float* v,
                              const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  attention_forward(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}
void attention_backward_onednn(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  attention_backward(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}
}  // namespace lt::cpu
#endif
