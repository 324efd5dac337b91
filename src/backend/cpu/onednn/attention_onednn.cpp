// attention_onednn.h: attention_blocks.h over oneDNN's sgemm and AVX-512 softmax rows.
#include "backend/cpu/avx512.h"  // first: its pragma precedes <immintrin.h>
#include "backend/cpu/onednn/attention_onednn.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "llamatrain/ops_cpu.h"

#if LLAMATRAIN_HAVE_ONEDNN
#include "backend/cpu/attention_blocks.h"
#include "backend/cpu/aligned_allocator.h"
#include "backend/cpu/onednn/matmul_onednn.h"
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

// ---- bf16 products (AMX) ----------------------------------------------------------------------
// The same blocks with bf16 operands and fp32 accumulation (gemm_bf16, oneDNN's AMX kernels), as
// PyTorch's bf16 autocast runs attention's batched products: q (scaled by 1/sqrt(hd) before the
// rounding), k, v and dO are rounded to bf16 once per head, P and dS once per block in the loops that
// compute them; the softmax, its statistics, D and every accumulation stay fp32. A block's first key
// is rounded down to a multiple of 16 (the extra keys are masked: P = dS = 0 there), which bounds the
// number of product shapes (a primitive per shape and thread, created once).

// dst (T,hd) bf16 = s * head h of src (B,T,NH,hd) in batch row b.
LT_AVX512 void gather_head_bf16(bf16* dst, const float* src, int b, int h, int Tn, int NH, int hd, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int t = 0; t < Tn; ++t) {
    const float* r = src + ((size_t(b) * Tn + t) * NH + h) * hd;
    bf16* d = dst + size_t(t) * hd;
    for (int c = 0; c < hd; c += 16) {
      const __mmask16 m = hd - c >= 16 ? __mmask16(0xffff) : avx512::tail_mask(hd - c);
      avx512::store_bf16(d + c, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, r + c), sv), m);
    }
  }
}

// Head h of dst (B,T,NH,hd) in batch row b = s * src (T,hd).
LT_AVX512 void scatter_head_scaled(float* dst, const float* src, int b, int h, int Tn, int NH, int hd, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int t = 0; t < Tn; ++t) {
    float* d = dst + ((size_t(b) * Tn + t) * NH + h) * hd;
    const float* r = src + size_t(t) * hd;
    for (int c = 0; c < hd; c += 16) {
      const __mmask16 m = hd - c >= 16 ? __mmask16(0xffff) : avx512::tail_mask(hd - c);
      _mm512_mask_storeu_ps(d + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, r + c), sv));
    }
  }
}

// pb[0, n) = bf16(p[0, n)).
LT_AVX512 void round_row(bf16* pb, const float* p, int n) {
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(n - j);
    avx512::store_bf16(pb + j, _mm512_maskz_loadu_ps(m, p + j), m);
  }
}

// ds = p * (ds - d) in fp32, and its bf16 rounding.
LT_AVX512 void ds_row_bf16(bf16* dsb, float* ds, const float* p, float d, int n) {
  const __m512 dv = _mm512_set1_ps(d);
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : avx512::tail_mask(n - j);
    const __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(m, ds + j), dv));
    avx512::store_bf16(dsb + j, r, m);
  }
}

inline int block_lo16(const int32_t* seg, int r0, int r1) { return attention_detail::block_key_begin(seg, r0, r1) & ~15; }

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  using namespace attention_detail;
  check_shapes(H, KVH, hd);
  const int group = H / KVH;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  const size_t head_size = size_t(Tn) * hd;
  const int n_tasks = B * H;
#pragma omp parallel
  {
    AlignedVector<bf16> qb(head_size), kb(head_size), vb(head_size), pb(size_t(kRowBlock) * Tn);
    AlignedVector<float> oh(head_size), s_blk(size_t(kRowBlock) * Tn);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int b = task / H, h = task % H, g = h / group;
      const int32_t* seg = seg_start ? seg_start + size_t(b) * Tn : nullptr;
      float* lse_bh = lse + (size_t(b) * H + h) * Tn;
      gather_head_bf16(qb.data(), q, b, h, Tn, H, hd, scale);
      gather_head_bf16(kb.data(), k, b, g, Tn, KVH, hd, 1.0f);
      gather_head_bf16(vb.data(), v, b, g, Tn, KVH, hd, 1.0f);
      for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
        const int r1 = std::min(Tn, r0 + kRowBlock), M = r1 - r0;
        const int lo = block_lo16(seg, r0, r1), nk = r1 - lo;
        float* o_blk = oh.data() + size_t(r0) * hd;
        float* S = s_blk.data();  // (M, nk), key j of a row is key lo + j
        onednn::gemm_bf16(false, true, M, nk, hd, qb.data() + size_t(r0) * hd, hd, kb.data() + size_t(lo) * hd, hd,
                          false, S, nk);
        for (int t = r0; t < r1; ++t) {
          float* row = S + size_t(t - r0) * nk;
          const int j0 = key_begin(seg, t) - lo, j1 = t + 1 - lo;  // allowed keys [j0, j1)
          if (j0 >= j1) {
            std::fill(row, row + nk, 0.0f);
            lse_bh[t] = -std::numeric_limits<float>::infinity();
          } else {
            lse_bh[t] = OnednnKernels::softmax_row(row, j0, j1, nk);
          }
          round_row(pb.data() + size_t(t - r0) * nk, row, nk);
        }
        onednn::gemm_bf16(false, false, M, hd, nk, pb.data(), nk, vb.data() + size_t(lo) * hd, hd, false, o_blk, hd);
      }
      scatter_head(out, oh.data(), b, h, Tn, H, hd);
    }
  }
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, const int32_t* seg_start, int B, int Tn,
                             int H, int KVH, int hd) {
  using namespace attention_detail;
  check_shapes(H, KVH, hd);
  const int group = H / KVH;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  const size_t head_size = size_t(Tn) * hd;
  const int n_tasks = B * KVH;
#pragma omp parallel
  {
    AlignedVector<bf16> kb(head_size), vb(head_size), qb(head_size), dob(head_size);
    AlignedVector<bf16> pb(size_t(kRowBlock) * Tn), dsb(size_t(kRowBlock) * Tn);
    AlignedVector<float> dkh(head_size), dvh(head_size), dqh(head_size), d_row(static_cast<size_t>(Tn));
    AlignedVector<float> p_blk(size_t(kRowBlock) * Tn), ds_blk(size_t(kRowBlock) * Tn);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int b = task / KVH, g = task % KVH;
      const int32_t* seg = seg_start ? seg_start + size_t(b) * Tn : nullptr;
      gather_head_bf16(kb.data(), k, b, g, Tn, KVH, hd, 1.0f);
      gather_head_bf16(vb.data(), v, b, g, Tn, KVH, hd, 1.0f);
      std::fill(dkh.begin(), dkh.end(), 0.0f);
      std::fill(dvh.begin(), dvh.end(), 0.0f);
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const float* lse_bh = lse + (size_t(b) * H + h) * Tn;
        gather_head_bf16(qb.data(), q, b, h, Tn, H, hd, scale);  // scale q: S = qs k^T, dK = dS^T qs
        gather_head_bf16(dob.data(), dout, b, h, Tn, H, hd, 1.0f);
        for (int t = 0; t < Tn; ++t) {  // D_t = dO_t . O_t from the fp32 values
          const size_t o = ((size_t(b) * Tn + t) * H + h) * hd;
          double d = 0.0;
          for (int c = 0; c < hd; ++c) d += double(dout[o + c]) * out[o + c];
          d_row[size_t(t)] = float(d);
        }
        for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
          const int r1 = std::min(Tn, r0 + kRowBlock), M = r1 - r0;
          const int lo = block_lo16(seg, r0, r1), nk = r1 - lo;
          float* P = p_blk.data();    // (M, nk)
          float* dS = ds_blk.data();  // (M, nk)
          onednn::gemm_bf16(false, true, M, nk, hd, qb.data() + size_t(r0) * hd, hd, kb.data() + size_t(lo) * hd, hd,
                            false, P, nk);
          for (int t = r0; t < r1; ++t) {
            float* row = P + size_t(t - r0) * nk;
            const int j0 = key_begin(seg, t) - lo, j1 = t + 1 - lo;
            if (j0 >= j1)
              std::fill(row, row + nk, 0.0f);
            else
              OnednnKernels::probability_row(row, j0, j1, nk, lse_bh[t]);
            round_row(pb.data() + size_t(t - r0) * nk, row, nk);
          }
          // dV[lo:r1] += P^T dO_blk
          onednn::gemm_bf16(true, false, nk, hd, M, pb.data(), nk, dob.data() + size_t(r0) * hd, hd, true,
                            dvh.data() + size_t(lo) * hd, hd);
          // dP = dO_blk V[lo:r1]^T, then dS = P * (dP - D)
          onednn::gemm_bf16(false, true, M, nk, hd, dob.data() + size_t(r0) * hd, hd, vb.data() + size_t(lo) * hd, hd,
                            false, dS, nk);
          for (int t = r0; t < r1; ++t)
            ds_row_bf16(dsb.data() + size_t(t - r0) * nk, dS + size_t(t - r0) * nk, P + size_t(t - r0) * nk,
                        d_row[size_t(t)], nk);
          // dQ_blk = scale dS K[lo:r1] (scaled when scattered); dK[lo:r1] += dS^T (scale Q_blk)
          onednn::gemm_bf16(false, false, M, hd, nk, dsb.data(), nk, kb.data() + size_t(lo) * hd, hd, false,
                            dqh.data() + size_t(r0) * hd, hd);
          onednn::gemm_bf16(true, false, nk, hd, M, dsb.data(), nk, qb.data() + size_t(r0) * hd, hd, true,
                            dkh.data() + size_t(lo) * hd, hd);
        }
        scatter_head_scaled(dq, dqh.data(), b, h, Tn, H, hd, scale);
      }
      scatter_head(dk, dkh.data(), b, g, Tn, KVH, hd);
      scatter_head(dv, dvh.data(), b, g, Tn, KVH, hd);
    }
  }
}

bool bf16_products(AttentionProducts p) {
  static const bool amx = onednn::has_amx();
  return p == AttentionProducts::kBf16 || (p == AttentionProducts::kAuto && amx);
}

}  // namespace

void attention_forward_onednn(float* out, float* lse, const float* q, const float* k, const float* v,
                              const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd,
                              AttentionProducts products) {
  if (!avx512::has_avx512()) return attention_forward(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
  if (bf16_products(products)) return attention_forward_bf16(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
  attention_forward_blocks<float, OnednnKernels>(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}

void attention_backward_onednn(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd,
                               AttentionProducts products) {
  if (!avx512::has_avx512())
    return attention_backward(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
  if (bf16_products(products))
    return attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
  attention_backward_blocks<float, OnednnKernels>(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH,
                                                  hd);
}

}  // namespace lt::cpu
#else  // without oneDNN's headers (the bf16 path is refused before it gets here): the reference

namespace lt::cpu {
void attention_forward_onednn(float* out, float* lse, const float* q, const float* k, const float* v,
                              const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd, AttentionProducts) {
  attention_forward(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}
void attention_backward_onednn(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd, AttentionProducts) {
  attention_backward(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
}
}  // namespace lt::cpu
#endif
