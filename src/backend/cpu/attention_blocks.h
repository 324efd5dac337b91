// Causal attention with GQA and example boundaries on the CPU, through per-head GEMMs: the blocked
// algorithm, written once over a kernel policy K that supplies the products and the row operations
// (attention_cpu.cpp: BLAS and scalar loops, the reference; onednn/attention_onednn.cpp: oneDNN's
// sgemm and AVX-512 rows, the bf16 path's):
//   K::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)  blas.h's convention
//   K::softmax_row(row, j0, j1, n)  row[j0, j1) = softmax of itself, the rest of row[0, n) = 0;
//                                   returns log sum_j exp(row_j) over [j0, j1) before the softmax
//   K::probability_row(row, j0, j1, n, lse)  row[j0, j1) = exp(row - lse), the rest = 0
//   K::ds_row(ds, p, d, n)          ds = p * (ds - d)
//
// Query t of head h attends to keys s of KV head h / (H / KVH) with seg_start[b,t] <= s <= t:
//   S = Q K^T / sqrt(hd),  P = softmax_masked(S),  O = P V,  lse_t = log sum_s exp(S_ts).
// Backward recomputes P = exp(S - lse) instead of storing (T,T) probabilities:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) with D_t = sum_d dO_td O_td (= sum_s P_ts dP_ts),
//   dQ = dS K / sqrt(hd),  dK = dS^T Q / sqrt(hd).
//
// Each head's q/k/v rows are gathered into contiguous (T,hd) scratch so BLAS sees dense matrices.
// Queries are processed in blocks of kRowBlock rows; a block only needs the keys from the smallest
// allowed start of its rows up to its last row, so the upper triangle (and, with packed examples,
// the keys of earlier examples) is mostly skipped. Tasks run in an OpenMP loop and every GEMM
// inside runs single-threaded (OpenBLAS's OpenMP build and oneDNN do not nest parallel regions), so each task is sequential code and the
// results do not depend on scheduling.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "llamatrain/error.h"

namespace lt::cpu {
namespace attention_detail {

constexpr int kRowBlock = 64;

// First key of query t: seg_start clamped to [0, t+1] (t+1 means no key at all, an empty row).
inline int key_begin(const int32_t* seg /*(T) of this row or null*/, int t) {
  return seg ? std::min(std::max(0, seg[t]), t + 1) : 0;
}

// dst (T,hd) = head h of src (B,T,NH,hd) in batch row b.
template <class T>
void gather_head(T* dst, const T* src, int b, int h, int Tn, int NH, int hd) {
  for (int t = 0; t < Tn; ++t)
    std::memcpy(dst + static_cast<size_t>(t) * hd,
                src + ((static_cast<size_t>(b) * Tn + t) * NH + h) * hd, sizeof(T) * hd);
}

// Head h of dst (B,T,NH,hd) in batch row b = src (T,hd).
template <class T>
void scatter_head(T* dst, const T* src, int b, int h, int Tn, int NH, int hd) {
  for (int t = 0; t < Tn; ++t)
    std::memcpy(dst + ((static_cast<size_t>(b) * Tn + t) * NH + h) * hd,
                src + static_cast<size_t>(t) * hd, sizeof(T) * hd);
}

// The key range [lo, r1) a query block [r0, r1) needs.
inline int block_key_begin(const int32_t* seg, int r0, int r1) {
  int lo = r1;
  for (int t = r0; t < r1; ++t) lo = std::min(lo, key_begin(seg, t));
  return lo;
}

inline void check_shapes(int H, int KVH, int hd) {
  LT_CHECK(KVH > 0 && H % KVH == 0, "attention: n_heads ", H, " not a multiple of n_kv_heads ",
           KVH);
  LT_CHECK(hd > 0, "attention: head_dim ", hd);
}

}  // namespace attention_detail

// One task per (b, h): heads are independent in the forward pass, so the loop has B*H tasks of
// equal cost. Each query block computes S, turns it into P in place, then O = P V.
template <class T, class K>
void attention_forward_blocks(T* out /*(B,T,H,hd)*/, T* lse /*(B,H,T)*/, const T* q /*(B,T,H,hd)*/,
                              const T* k /*(B,T,KVH,hd)*/, const T* v /*(B,T,KVH,hd)*/,
                              const int32_t* seg_start /*(B,T)*/, int B, int Tn, int H, int KVH, int hd) {
  using namespace attention_detail;
  check_shapes(H, KVH, hd);
  const int group = H / KVH;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t head_size = static_cast<size_t>(Tn) * hd;
  const int n_tasks = B * H;
#pragma omp parallel
  {
    std::vector<T> qh(head_size), kh(head_size), vh(head_size), oh(head_size);
    std::vector<T> s_blk(static_cast<size_t>(kRowBlock) * Tn);  // (rows, keys) scores, then P
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int b = task / H, h = task % H, g = h / group;
      const int32_t* seg = seg_start ? seg_start + static_cast<size_t>(b) * Tn : nullptr;
      T* lse_bh = lse + (static_cast<size_t>(b) * H + h) * Tn;
      gather_head(qh.data(), q, b, h, Tn, H, hd);
      gather_head(kh.data(), k, b, g, Tn, KVH, hd);
      gather_head(vh.data(), v, b, g, Tn, KVH, hd);
      for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
        const int r1 = std::min(Tn, r0 + kRowBlock), M = r1 - r0;
        const int lo = block_key_begin(seg, r0, r1), nk = r1 - lo;
        T* o_blk = oh.data() + static_cast<size_t>(r0) * hd;
        if (nk == 0) {
          std::fill(o_blk, o_blk + static_cast<size_t>(M) * hd, T(0));
          std::fill(lse_bh + r0, lse_bh + r1, -std::numeric_limits<T>::infinity());
          continue;
        }
        T* S = s_blk.data();  // (M, nk), key j of a row is key lo + j
        K::gemm(false, true, M, nk, hd, scale, qh.data() + static_cast<size_t>(r0) * hd, hd,
                   kh.data() + static_cast<size_t>(lo) * hd, hd, T(0), S, nk);
        for (int t = r0; t < r1; ++t) {
          T* row = S + static_cast<size_t>(t - r0) * nk;
          const int j0 = key_begin(seg, t) - lo, j1 = t + 1 - lo;  // allowed keys [j0, j1)
          if (j0 >= j1) {
            std::fill(row, row + nk, T(0));
            lse_bh[t] = -std::numeric_limits<T>::infinity();
            continue;
          }
          lse_bh[t] = K::softmax_row(row, j0, j1, nk);
        }
        K::gemm(false, false, M, hd, nk, T(1), S, nk, vh.data() + static_cast<size_t>(lo) * hd,
                   hd, T(0), o_blk, hd);
      }
      scatter_head(out, oh.data(), b, h, Tn, H, hd);
    }
  }
}
// One task per (b, KV head): the heads of one group run serially inside the task, so their dK and
// dV contributions accumulate into the task's own scratch without races and in a fixed order.
template <class T, class K>
void attention_backward_blocks(T* dq /*(B,T,H,hd) =*/, T* dk /*(B,T,KVH,hd) =*/, T* dv /*(B,T,KVH,hd) =*/,
                               const T* dout /*(B,T,H,hd)*/, const T* out /*(B,T,H,hd)*/,
                               const T* lse /*(B,H,T)*/, const T* q, const T* k, const T* v,
                               const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  using namespace attention_detail;
  check_shapes(H, KVH, hd);
  const int group = H / KVH;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t head_size = static_cast<size_t>(Tn) * hd;
  const int n_tasks = B * KVH;
#pragma omp parallel
  {
    std::vector<T> kh(head_size), vh(head_size), dkh(head_size), dvh(head_size);
    std::vector<T> qh(head_size), oh(head_size), doh(head_size), dqh(head_size);
    std::vector<T> d_row(Tn);                                    // D_t = dO_t . O_t
    std::vector<T> p_blk(static_cast<size_t>(kRowBlock) * Tn);   // (rows, keys) P
    std::vector<T> ds_blk(static_cast<size_t>(kRowBlock) * Tn);  // (rows, keys) dP, then dS
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int b = task / KVH, g = task % KVH;
      const int32_t* seg = seg_start ? seg_start + static_cast<size_t>(b) * Tn : nullptr;
      gather_head(kh.data(), k, b, g, Tn, KVH, hd);
      gather_head(vh.data(), v, b, g, Tn, KVH, hd);
      std::fill(dkh.begin(), dkh.end(), T(0));
      std::fill(dvh.begin(), dvh.end(), T(0));
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const T* lse_bh = lse + (static_cast<size_t>(b) * H + h) * Tn;
        gather_head(qh.data(), q, b, h, Tn, H, hd);
        gather_head(oh.data(), out, b, h, Tn, H, hd);
        gather_head(doh.data(), dout, b, h, Tn, H, hd);
        for (int t = 0; t < Tn; ++t) {
          double d = 0.0;
          for (int c = 0; c < hd; ++c)
            d += static_cast<double>(doh[static_cast<size_t>(t) * hd + c]) *
                 oh[static_cast<size_t>(t) * hd + c];
          d_row[t] = static_cast<T>(d);
        }
        for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
          const int r1 = std::min(Tn, r0 + kRowBlock), M = r1 - r0;
          const int lo = block_key_begin(seg, r0, r1), nk = r1 - lo;
          const T* q_blk = qh.data() + static_cast<size_t>(r0) * hd;
          const T* do_blk = doh.data() + static_cast<size_t>(r0) * hd;
          T* dq_blk = dqh.data() + static_cast<size_t>(r0) * hd;
          const T* k_lo = kh.data() + static_cast<size_t>(lo) * hd;
          const T* v_lo = vh.data() + static_cast<size_t>(lo) * hd;
          if (nk == 0) {
            std::fill(dq_blk, dq_blk + static_cast<size_t>(M) * hd, T(0));
            continue;
          }
          T* P = p_blk.data();    // (M, nk)
          T* dS = ds_blk.data();  // (M, nk)
          // P = exp(scale Q K^T - lse) on allowed keys, 0 elsewhere.
          K::gemm(false, true, M, nk, hd, scale, q_blk, hd, k_lo, hd, T(0), P, nk);
          for (int t = r0; t < r1; ++t) {
            T* row = P + static_cast<size_t>(t - r0) * nk;
            const int j0 = key_begin(seg, t) - lo, j1 = t + 1 - lo;
            K::probability_row(row, j0, j1, nk, lse_bh[t]);
          }
          // dV[lo:r1] += P^T dO_blk
          K::gemm(true, false, nk, hd, M, T(1), P, nk, do_blk, hd, T(1),
                     dvh.data() + static_cast<size_t>(lo) * hd, hd);
          // dP = dO_blk V[lo:r1]^T, then dS = P * (dP - D) (zero wherever P is)
          K::gemm(false, true, M, nk, hd, T(1), do_blk, hd, v_lo, hd, T(0), dS, nk);
          for (int t = r0; t < r1; ++t) {
            const T* prow = P + static_cast<size_t>(t - r0) * nk;
            T* srow = dS + static_cast<size_t>(t - r0) * nk;
            K::ds_row(srow, prow, d_row[t], nk);
          }
          // dQ_blk = scale dS K[lo:r1]; dK[lo:r1] += scale dS^T Q_blk
          K::gemm(false, false, M, hd, nk, scale, dS, nk, k_lo, hd, T(0), dq_blk, hd);
          K::gemm(true, false, nk, hd, M, scale, dS, nk, q_blk, hd, T(1),
                     dkh.data() + static_cast<size_t>(lo) * hd, hd);
        }
        scatter_head(dq, dqh.data(), b, h, Tn, H, hd);
      }
      scatter_head(dk, dkh.data(), b, g, Tn, KVH, hd);
      scatter_head(dv, dvh.data(), b, g, Tn, KVH, hd);
    }
  }
}

}  // namespace lt::cpu
