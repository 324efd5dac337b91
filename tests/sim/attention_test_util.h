// Attention test cases shared by the CUDA-core (test_attention_sim.cpp) and tensor-core
// (test_attention_tc_sim.cpp) kernel tests and the device program (tests/gpu/kernel_checks.cu):
// padded head tensors whose padding holds a sentinel, the shapes and packed-example layouts
// (kernel_cases.h), seeded inputs, and the views the CPU reference takes.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "kernel_cases.h"
#include "sim_test_util.h"

namespace lt::simtest::attention {

using lt::cuda::AttentionHeads;
using lt::cuda::AttentionKernel;
using lt::cuda::AttentionParams;

// A padded (rows, NH, hd) bf16 buffer: head stride hd + head_pad, token stride NH * head stride + kPad
// (head_pad and kPad multiples of 8: the kernels need 16-byte aligned heads); padding holds the
// sentinel. Attention tensors are views of NH' <= NH heads starting at head h0, so q, k and v can
// live in one fused (rows, H + 2 KVH, hd) buffer as the qkv projection writes them.
struct Heads {
  int rows, NH, hd;
  int64_t head_stride, token_stride;
  std::vector<__nv_bfloat16> data;
  Heads(int r, int nh, int d, int head_pad)
      : rows(r), NH(nh), hd(d), head_stride(d + head_pad), token_stride(nh * (d + head_pad) + kPad),
        data(static_cast<size_t>(r) * (nh * (d + head_pad) + kPad) + kPad, __float2bfloat16(kSentinel)) {}
  int64_t index(int r, int h, int c) const { return r * token_stride + h * head_stride + c; }
  float get(int r, int h, int c) const { return __bfloat162float(data[index(r, h, c)]); }
  void set(int r, int h, int c, float v) { data[index(r, h, c)] = __float2bfloat16(v); }
  int touched_padding() const {
    std::vector<char> inside(data.size(), 0);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < hd; ++c) inside[index(r, h, c)] = 1;
    int bad = 0;
    for (size_t i = 0; i < data.size(); ++i)
      if (!inside[i] && __bfloat162float(data[i]) != kSentinel) ++bad;
    return bad;
  }
  AttentionHeads<__nv_bfloat16> view(int h0) { return {data.data() + h0 * head_stride, token_stride, head_stride}; }
  AttentionHeads<const __nv_bfloat16> cview(int h0) const {
    return {data.data() + h0 * head_stride, token_stride, head_stride};
  }
};

// A view of nh heads of a Heads buffer starting at head h0.
struct View {
  Heads* buf;
  int h0, nh;
  float get(int r, int h, int c) const { return buf->get(r, h0 + h, c); }
  // Dense (rows, nh, hd) copy for the CPU op.
  template <class T>
  std::vector<T> dense() const {
    std::vector<T> v(static_cast<size_t>(buf->rows) * nh * buf->hd);
    for (int r = 0; r < buf->rows; ++r)
      for (int h = 0; h < nh; ++h)
        for (int c = 0; c < buf->hd; ++c) v[(static_cast<size_t>(r) * nh + h) * buf->hd + c] = get(r, h, c);
    return v;
  }
};

// The cases (kernel_cases.h: one table for these tests and the device program).
using Seg = kernelcases::AttentionSeg;
using Shape = kernelcases::Attention;
// The table's cases the simulator's tests run (the `large` ones are the device program's).
inline std::vector<Shape> sim_shapes() {
  std::vector<Shape> v;
  for (const Shape& s : kernelcases::kAttention)
    if (!s.large) v.push_back(s);
  return v;
}
inline unsigned seed_for(const Shape& s, unsigned salt) { return s.seed(salt); }
// The tensor-core kernels' cases (test_attention_tc_sim.cpp and the device program): each shape at
// head_dim 64 and at 128, the kernels' two, with these seeds' salts.
inline std::vector<Shape> tc_variants(const Shape& s) {
  Shape a = s, b = s;
  a.hd = 64, b.hd = 128;
  return {a, b};
}
inline constexpr unsigned kTcForwardSalt = 11, kTcBackwardSalt = 14;
inline std::vector<int32_t> make_seg(const Shape& s, std::mt19937& rng) { return kernelcases::attention_seg(s, rng); }

// Inputs of one case and the buffers the kernels write.
struct Case {
  Shape s;
  std::vector<int32_t> seg;
  Heads qkv_buf, k_buf, v_buf;  // q (and k, v when fused) / k / v
  View q, k, v;
  Heads out, dout;
  Heads dqkv_buf, dk_buf, dv_buf;
  View dq, dk, dv;
  std::vector<float> lse, dsum;  // (B,H,T) + kPad sentinels
  AttentionKernel kernel = AttentionKernel::kAuto;  // which kernels params() asks for

  explicit Case(const Shape& sh)
      : s(sh),
        qkv_buf(sh.B * sh.T, sh.fused ? sh.H + 2 * sh.KVH : sh.H, sh.hd, sh.head_pad),
        k_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        v_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        q{&qkv_buf, 0, sh.H},
        k{sh.fused ? &qkv_buf : &k_buf, sh.fused ? sh.H : 0, sh.KVH},
        v{sh.fused ? &qkv_buf : &v_buf, sh.fused ? sh.H + sh.KVH : 0, sh.KVH},
        out(sh.B * sh.T, sh.H, sh.hd, sh.head_pad),
        dout(sh.B * sh.T, sh.H, sh.hd, sh.head_pad),
        dqkv_buf(sh.B * sh.T, sh.fused ? sh.H + 2 * sh.KVH : sh.H, sh.hd, sh.head_pad),
        dk_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        dv_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        dq{&dqkv_buf, 0, sh.H},
        dk{sh.fused ? &dqkv_buf : &dk_buf, sh.fused ? sh.H : 0, sh.KVH},
        dv{sh.fused ? &dqkv_buf : &dv_buf, sh.fused ? sh.H + sh.KVH : 0, sh.KVH},
        lse(static_cast<size_t>(sh.B) * sh.H * sh.T + kPad, kSentinel),
        dsum(lse.size(), kSentinel) {}

  AttentionParams params() {
    AttentionParams p;
    p.out = out.view(0), p.lse = lse.data();
    p.q = q.buf->cview(q.h0), p.k = k.buf->cview(k.h0), p.v = v.buf->cview(v.h0);
    p.seg_start = seg.empty() ? nullptr : seg.data();
    p.dout = dout.cview(0);
    p.dq = dq.buf->view(dq.h0), p.dk = dk.buf->view(dk.h0), p.dv = dv.buf->view(dv.h0);
    p.dsum = dsum.data();
    p.B = s.B, p.T = s.T, p.H = s.H, p.KVH = s.KVH, p.hd = s.hd;
    p.kernel = kernel;
    return p;
  }
  int rows() const { return s.B * s.T; }
  const int32_t* seg_ptr() const { return seg.empty() ? nullptr : seg.data(); }
};

inline void fill(const View& x, int rows, float std, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, std);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < x.nh; ++h)
      for (int c = 0; c < x.buf->hd; ++c) x.buf->set(r, x.h0 + h, c, dist(rng));
}

inline void make_inputs(Case& k, unsigned seed) {
  std::mt19937 rng(seed);
  k.seg = make_seg(k.s, rng);
  fill(k.q, k.rows(), k.s.qk_std, rng);
  fill(k.k, k.rows(), k.s.qk_std, rng);
  fill(k.v, k.rows(), 1.f, rng);
  fill(View{&k.dout, 0, k.s.H}, k.rows(), 1.f, rng);
}

inline void print_case(const char* what, const Shape& s, unsigned seed) {
  static const char* kSeg[] = {"none", "packed", "odd"};
  std::printf("[attention %s] B=%d T=%d H=%d KVH=%d hd=%d seg=%s fused=%d head_pad=%d qk_std=%g seed=%u\n", what, s.B,
              s.T, s.H, s.KVH, s.hd, kSeg[static_cast<int>(s.seg)], s.fused, s.head_pad, s.qk_std, seed);
}


// ---- the kernels' rule (test_attention_sim.cpp, test_attention_tc_sim.cpp, the device program) ----
// Each output element within the bf16 rounding of the fp32 result, plus the fp32 summation-order
// floor; the tensor-core kernels round P and dS to bf16 for the mma, so theirs may also be off by
// the bf16 rounding of those operands (the operand term, from fp64_terms), and dQ, dK by the fp32
// error of dS (the fp32 term). The worst error stays within 2x the naive bf16 computation's plus
// the largest fp32 term (the floor). The CUDA-core kernels have neither term.
inline constexpr double kU = 1.0 / 256;  // bf16 unit roundoff 2^-8

// One bf16 output tensor against fp32 and fp64 references and its operand-rounding term
// (dense (rows, nh, hd) each).
struct Comparison {
  ErrorReport kernel, naive;  // vs fp64
  int violations = 0;         // elements beyond the per-element bound
  double worst_bound_use = 0; // max |kernel - fp32| / bound
  double floor = 0;           // max of the fp32 term: added to 2x the naive error
  std::string first_violation;
};

inline Comparison compare(const View& got, const std::vector<float>& r32, const std::vector<double>& r64,
                   const std::vector<double>& operand_abs, const std::vector<double>& fp32_term) {
  Comparison c;
  for (double x : fp32_term) c.floor = std::max(c.floor, x);
  double max32 = 0.0;
  for (float x : r32) max32 = std::max(max32, static_cast<double>(std::fabs(x)));
  const int hd = got.buf->hd;
  for (int r = 0; r < got.buf->rows; ++r)
    for (int h = 0; h < got.nh; ++h)
      for (int d = 0; d < hd; ++d) {
        const size_t i = (static_cast<size_t>(r) * got.nh + h) * hd + d;
        const double g = got.get(r, h, d);
        c.kernel.add(r, h * hd + d, g, r64[i]);
        c.naive.add(r, h * hd + d, bf(r32[i]), r64[i]);
        const double tol = kU * (std::fabs(r32[i]) + 1.02 * operand_abs[i]) + fp32_term[i] + 1e-5 * max32;
        const double err = std::fabs(g - r32[i]);
        if (tol > 0) c.worst_bound_use = std::max(c.worst_bound_use, err / tol);
        if (!(err <= tol) && c.violations++ == 0) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "row %d head %d col %d: got %.8g fp32 %.8g tol %.3g", r, h, d, g, r32[i], tol);
          c.first_violation = buf;
        }
      }
  return c;
}

// The rule without operand or fp32 terms: the CUDA-core kernels'.
inline Comparison compare(const View& got, const std::vector<float>& r32, const std::vector<double>& r64) {
  const std::vector<double> none(r32.size(), 0.0);
  return compare(got, r32, r64, none, none);
}

// fp64 attention quantities per (b, t, h, s) for the operand-rounding terms, from the same bf16
// inputs: P = softmax of the allowed scores, dS = P (dP - D) with D = sum_c dO O (from the
// kernel's own out, as the kernel computes it).
struct Fp64Terms {
  std::vector<double> out_abs;            // sum_s P_ts |v_sc|                     (rows, H, hd)
  std::vector<double> dq_abs;             // scale sum_s |dS_ts| |k_sc|            (rows, H, hd)
  std::vector<double> dk_abs, dv_abs;     // scale sum_t |dS_ts| |q_tc|, sum_t P_ts |dO_tc| (rows, KVH, hd)
  std::vector<double> dq_f32, dk_f32;     // the fp32 error of dS carried into dQ, dK
  std::vector<double> zero_q, zero_kv;    // no such term (out; dV)
};

inline Fp64Terms fp64_terms(const Case& k, bool backward) {
  const Shape& s = k.s;
  const int hd = s.hd, group = s.H / s.KVH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Fp64Terms f;
  const size_t nq = static_cast<size_t>(k.rows()) * s.H * hd, nk = static_cast<size_t>(k.rows()) * s.KVH * hd;
  f.out_abs.assign(nq, 0.0), f.dq_abs.assign(nq, 0.0), f.dk_abs.assign(nk, 0.0), f.dv_abs.assign(nk, 0.0);
  f.dq_f32.assign(nq, 0.0), f.dk_f32.assign(nk, 0.0), f.zero_q.assign(nq, 0.0), f.zero_kv.assign(nk, 0.0);
  const double gamma = hd * std::ldexp(1.0, -24);
  std::vector<double> p(s.T), ds(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int t = 0; t < s.T; ++t) {
        const int r = b * s.T + t, g = h / group;
        int kb = k.seg.empty() ? 0 : k.seg[static_cast<size_t>(b) * s.T + t];
        kb = std::min(std::max(kb, 0), t + 1);
        double mx = -INFINITY;
        for (int j = kb; j <= t; ++j) {
          double sc = 0;
          for (int c = 0; c < hd; ++c) sc += double(k.q.get(r, h, c)) * k.k.get(b * s.T + j, g, c);
          p[j] = sc * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = kb; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = kb; j <= t; ++j) p[j] /= sum;
        const size_t oq = (static_cast<size_t>(r) * s.H + h) * hd;
        for (int j = kb; j <= t; ++j)
          for (int c = 0; c < hd; ++c) f.out_abs[oq + c] += p[j] * std::fabs(k.v.get(b * s.T + j, g, c));
        if (!backward) continue;
        double dsum = 0, dsum_abs = 0;
        for (int c = 0; c < hd; ++c) {
          dsum += double(k.dout.get(r, h, c)) * k.out.get(r, h, c);
          dsum_abs += std::fabs(double(k.dout.get(r, h, c)) * k.out.get(r, h, c));
        }
        for (int j = kb; j <= t; ++j) {
          double dp = 0, dp_abs = 0;
          for (int c = 0; c < hd; ++c) {
            dp += double(k.dout.get(r, h, c)) * k.v.get(b * s.T + j, g, c);
            dp_abs += std::fabs(double(k.dout.get(r, h, c)) * k.v.get(b * s.T + j, g, c));
          }
          ds[j] = p[j] * (dp - dsum);
          const double ds_err = p[j] * gamma * (dp_abs + dsum_abs);
          const size_t ok = (static_cast<size_t>(b * s.T + j) * s.KVH + g) * hd;
          for (int c = 0; c < hd; ++c) {
            f.dq_abs[oq + c] += scale * std::fabs(ds[j]) * std::fabs(k.k.get(b * s.T + j, g, c));
            f.dk_abs[ok + c] += scale * std::fabs(ds[j]) * std::fabs(k.q.get(r, h, c));
            f.dv_abs[ok + c] += p[j] * std::fabs(k.dout.get(r, h, c));
            f.dq_f32[oq + c] += scale * ds_err * std::fabs(k.k.get(b * s.T + j, g, c));
            f.dk_f32[ok + c] += scale * ds_err * std::fabs(k.q.get(r, h, c));
          }
        }
      }
  return f;
}

}  // namespace lt::simtest::attention
