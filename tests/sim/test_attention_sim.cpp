// kernels/attention.cu under the CUDA simulator, against the CPU backend (lt::cpu::attention_*)
// in fp32 and fp64. q, k, v, dout are bf16; every reference sees the same bf16 values, and the
// backward references get the kernel's own forward outputs (bf16 out, fp32 lse) as inputs, as the
// kernel does. Low-precision rule (STYLE.md): the kernel's worst error against fp64 is at most 2x
// that of the naive bf16 computation (the fp32 CPU op's result rounded to bf16). Every bf16 output
// element is also held to the CPU fp32 result within bf16 rounding, and the fp32 lse to fp64 within
// an fp32 bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.cuh"
#include "llamatrain/ops_cpu.h"
#include "sim_test_util.h"

namespace {

using lt::cuda::AttentionHeads;
using lt::cuda::AttentionParams;
using lt::simtest::bf;
using lt::simtest::describe;
using lt::simtest::ErrorReport;
using lt::simtest::kPad;
using lt::simtest::kSentinel;

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

enum class Seg { kNone, kPacked, kOdd };

struct Shape {
  int B, T, H, KVH, hd;
  Seg seg;
  bool fused;    // q, k, v views of one (B*T, H + 2 KVH, hd) buffer (and dq, dk, dv of another)
  int head_pad;  // extra elements between heads of separate tensors
  float qk_std;  // std of q and k: larger means peakier softmax rows
};

// Tile sizes in attention.cu: 32 (hd 16, 32), 64/32 (hd 64, 128). T values are not multiples of
// them; packed rows put an example start at t = 13 (mid-tile) and more at random places.
const Shape kShapes[] = {
    {2, 37, 2, 2, 16, Seg::kNone, false, 0, 1.f},     // group 1
    {1, 70, 4, 2, 32, Seg::kPacked, false, 8, 1.f},   // group 2, three query tiles
    {2, 50, 4, 1, 16, Seg::kOdd, false, 0, 2.f},      // group 4; rows 32..49 (a whole tile) empty
    {1, 100, 2, 1, 64, Seg::kPacked, false, 8, 1.f},  // group 2
    {2, 65, 2, 2, 64, Seg::kNone, true, 0, 1.5f},     // fused qkv, T = tile + 1
    {1, 77, 4, 1, 128, Seg::kPacked, true, 0, 1.f},   // group 4, fused
    {1, 45, 2, 2, 128, Seg::kOdd, false, 8, 3.f},     // large scores, odd seg_start values
    {3, 20, 4, 2, 32, Seg::kPacked, true, 0, 1.f},    // B = 3, one tile
    {1, 1, 2, 1, 32, Seg::kNone, false, 0, 1.f},      // T = 1
    {2, 200, 4, 2, 16, Seg::kPacked, false, 0, 1.5f}, // many tiles and examples per row
    {1, 160, 2, 1, 128, Seg::kPacked, true, 0, 1.f},  // five key tiles per late query tile
    {1, 130, 4, 4, 64, Seg::kOdd, false, 8, 2.f},     // group 1, half a query tile of empty rows
};

unsigned seed_for(const Shape& s, unsigned salt) {
  return 1000003u * s.T + 7919u * s.H + 131u * s.KVH + 17u * s.hd + 3u * static_cast<unsigned>(s.seg) + 101u * s.B +
         salt;
}

// seg_start per (b, t). kPacked: examples start at 0, 13 and random later places (lengths 5..T/2).
// kOdd: packed, plus values the CPU op clamps: rows 32..63 empty (seg_start > t), a few more empty
// rows, and a few negative ones (clamped to 0).
std::vector<int32_t> make_seg(const Shape& s, std::mt19937& rng) {
  std::vector<int32_t> seg;
  if (s.seg == Seg::kNone) return seg;
  seg.resize(static_cast<size_t>(s.B) * s.T);
  std::uniform_int_distribution<int> len(5, s.T / 2 > 5 ? s.T / 2 : 5);
  for (int b = 0; b < s.B; ++b) {
    int start = 0, next = s.T > 13 ? 13 : s.T;
    for (int t = 0; t < s.T; ++t) {
      if (t == next) start = t, next = t + len(rng);
      seg[static_cast<size_t>(b) * s.T + t] = start;
    }
    if (s.seg == Seg::kOdd) {
      std::uniform_int_distribution<int> pick(0, s.T - 1);
      for (int t = 32; t < 64 && t < s.T; ++t) seg[static_cast<size_t>(b) * s.T + t] = t + 1 + (t % 3);
      for (int n = 0; n < 3; ++n) {
        const int t = pick(rng);
        seg[static_cast<size_t>(b) * s.T + t] = t + 2;
      }
      for (int n = 0; n < 3; ++n) seg[static_cast<size_t>(b) * s.T + pick(rng)] = -7;
    }
  }
  return seg;
}

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
    return p;
  }
  int rows() const { return s.B * s.T; }
  const int32_t* seg_ptr() const { return seg.empty() ? nullptr : seg.data(); }
};

void fill(const View& x, int rows, float std, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, std);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < x.nh; ++h)
      for (int c = 0; c < x.buf->hd; ++c) x.buf->set(r, x.h0 + h, c, dist(rng));
}

void make_inputs(Case& k, unsigned seed) {
  std::mt19937 rng(seed);
  k.seg = make_seg(k.s, rng);
  fill(k.q, k.rows(), k.s.qk_std, rng);
  fill(k.k, k.rows(), k.s.qk_std, rng);
  fill(k.v, k.rows(), 1.f, rng);
  fill(View{&k.dout, 0, k.s.H}, k.rows(), 1.f, rng);
}

double ratio(const ErrorReport& a, const ErrorReport& n) { return n.worst > 0 ? a.worst / n.worst : 0.0; }

// One bf16 output tensor against the fp32 and fp64 CPU results (dense (rows, nh, hd)).
struct Comparison {
  ErrorReport kernel, naive;  // vs fp64
  int bf16_violations = 0;    // elements off the fp32 result by more than bf16 rounding
  std::string first_violation;
};

// |kernel - fp32| <= 2^-8 |fp32| (round to nearest bf16: half an ulp is at most 2^-8 of the value)
// + 1e-5 max|fp32|: the two fp32 results differ only by summation order over at most
// T * group terms of size <= max|result| (here < 400 terms: ~400 * 2^-24 = 2.4e-5 worst case,
// sqrt(400) * 2^-24 ~ 1.2e-6 typical) -- a floor far below one bf16 ulp of the large elements.
Comparison compare(const View& got, const std::vector<float>& r32, const std::vector<double>& r64) {
  Comparison c;
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
        const double tol = std::ldexp(std::fabs(r32[i]), -8) + 1e-5 * max32;
        if (!(std::fabs(g - r32[i]) <= tol) && c.bf16_violations++ == 0) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "row %d head %d col %d: got %.8g fp32 %.8g tol %.3g", r, h, d, g, r32[i], tol);
          c.first_violation = buf;
        }
      }
  return c;
}

void expect_close(const char* name, const Comparison& c) {
  std::printf("  %s\n  %s\n  %s kernel/naive ratio %.3g, %d elements beyond bf16 rounding of fp32\n",
              describe((std::string(name) + " kernel vs fp64").c_str(), c.kernel).c_str(),
              describe((std::string(name) + " naive bf16 vs fp64").c_str(), c.naive).c_str(), name,
              ratio(c.kernel, c.naive), c.bf16_violations);
  EXPECT_TRUE(c.kernel.finite) << name << " has NaN/Inf";
  EXPECT_LE(c.kernel.worst, 2.0 * c.naive.worst) << describe(name, c.kernel);
  EXPECT_EQ(c.bf16_violations, 0) << name << " first: " << c.first_violation;
}

void print_case(const char* what, const Shape& s, unsigned seed) {
  static const char* kSeg[] = {"none", "packed", "odd"};
  std::printf("[attention %s] B=%d T=%d H=%d KVH=%d hd=%d seg=%s fused=%d head_pad=%d qk_std=%g seed=%u\n", what, s.B,
              s.T, s.H, s.KVH, s.hd, kSeg[static_cast<int>(s.seg)], s.fused, s.head_pad, s.qk_std, seed);
}

TEST(AttentionSim, ForwardMatchesCpuAndFp64) {
  for (const Shape& s : kShapes) {
    const unsigned seed = seed_for(s, 1);
    print_case("fwd", s, seed);
    Case k(s);
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);

    const std::vector<float> q32 = k.q.dense<float>(), k32 = k.k.dense<float>(), v32 = k.v.dense<float>();
    const std::vector<double> q64 = k.q.dense<double>(), k64 = k.k.dense<double>(), v64 = k.v.dense<double>();
    std::vector<float> out32(q32.size()), lse32(static_cast<size_t>(s.B) * s.H * s.T);
    std::vector<double> out64(q32.size()), lse64(lse32.size());
    lt::cpu::attention_forward(out32.data(), lse32.data(), q32.data(), k32.data(), v32.data(), k.seg_ptr(), s.B, s.T,
                               s.H, s.KVH, s.hd);
    lt::cpu::attention_forward(out64.data(), lse64.data(), q64.data(), k64.data(), v64.data(), k.seg_ptr(), s.B, s.T,
                               s.H, s.KVH, s.hd);

    expect_close("out", compare(View{&k.out, 0, s.H}, out32, out64));

    // lse (fp32): the scores' rounding error is about hd * 2^-24 * sum_d |q_d k_d| / sqrt(hd) <= 2^-24 hd
    // max|q| max|k| sqrt(hd), the log-sum-exp adds a few ulps of |lse| and T ulps of the sum.
    double qmax = 0, kmax = 0;
    for (float x : q32) qmax = std::max(qmax, static_cast<double>(std::fabs(x)));
    for (float x : k32) kmax = std::max(kmax, static_cast<double>(std::fabs(x)));
    const double score_err = std::ldexp(1.0, -24) * s.hd * qmax * kmax * std::sqrt(static_cast<double>(s.hd));
    ErrorReport lse_err;
    int lse_bad = 0, inf_mismatch = 0;
    for (size_t i = 0; i < lse64.size(); ++i) {
      if (std::isinf(lse64[i])) {  // an empty row: -inf in both
        if (!(std::isinf(k.lse[i]) && k.lse[i] < 0)) ++inf_mismatch;
        continue;
      }
      lse_err.add(static_cast<int>(i), 0, k.lse[i], lse64[i]);
      const double tol = score_err + std::ldexp(1.0, -22) * (std::fabs(lse64[i]) + s.T);
      if (!(std::fabs(k.lse[i] - lse64[i]) <= tol)) ++lse_bad;
    }
    std::printf("  %s (score error bound %.3g)\n", describe("lse kernel vs fp64", lse_err).c_str(), score_err);
    EXPECT_TRUE(lse_err.finite);
    EXPECT_EQ(lse_bad, 0) << describe("lse", lse_err);
    EXPECT_EQ(inf_mismatch, 0) << "empty rows must have lse = -inf";
    EXPECT_EQ(k.out.touched_padding(), 0) << "out padding written";
    for (int i = 0; i < kPad; ++i) EXPECT_EQ(k.lse[lse64.size() + i], kSentinel) << "lse written past B*H*T";
  }
}

TEST(AttentionSim, BackwardMatchesCpuAndFp64) {
  for (const Shape& s : kShapes) {
    const unsigned seed = seed_for(s, 2);
    print_case("bwd", s, seed);
    Case k(s);
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);
    lt::cuda::attention_backward_cuda(p, nullptr);

    const size_t n_stat = static_cast<size_t>(s.B) * s.H * s.T;
    const View out{&k.out, 0, s.H}, dout{&k.dout, 0, s.H};
    const std::vector<float> q32 = k.q.dense<float>(), k32 = k.k.dense<float>(), v32 = k.v.dense<float>();
    const std::vector<float> o32 = out.dense<float>(), do32 = dout.dense<float>();
    const std::vector<float> lse32(k.lse.begin(), k.lse.begin() + n_stat);
    const std::vector<double> q64 = k.q.dense<double>(), k64 = k.k.dense<double>(), v64 = k.v.dense<double>();
    const std::vector<double> o64 = out.dense<double>(), do64 = dout.dense<double>();
    const std::vector<double> lse64(lse32.begin(), lse32.end());
    std::vector<float> dq32(q32.size()), dk32(k32.size()), dv32(v32.size());
    std::vector<double> dq64(q32.size()), dk64(k32.size()), dv64(v32.size());
    lt::cpu::attention_backward(dq32.data(), dk32.data(), dv32.data(), do32.data(), o32.data(), lse32.data(),
                                q32.data(), k32.data(), v32.data(), k.seg_ptr(), s.B, s.T, s.H, s.KVH, s.hd);
    lt::cpu::attention_backward(dq64.data(), dk64.data(), dv64.data(), do64.data(), o64.data(), lse64.data(),
                                q64.data(), k64.data(), v64.data(), k.seg_ptr(), s.B, s.T, s.H, s.KVH, s.hd);

    expect_close("dq", compare(k.dq, dq32, dq64));
    expect_close("dk", compare(k.dk, dk32, dk64));
    expect_close("dv", compare(k.dv, dv32, dv64));
    EXPECT_EQ(k.dqkv_buf.touched_padding(), 0) << "dq (dqkv) padding written";
    EXPECT_EQ(k.dk_buf.touched_padding(), 0) << "dk padding written";
    EXPECT_EQ(k.dv_buf.touched_padding(), 0) << "dv padding written";
    for (int i = 0; i < kPad; ++i) EXPECT_EQ(k.dsum[n_stat + i], kSentinel) << "dsum written past B*H*T";
  }
}

// The backward pass twice, the second time over outputs and scratch prefilled with NaN: the
// same bits (no order-dependent sums, no reads of stale output or scratch contents).
TEST(AttentionSim, BackwardIsDeterministic) {
  const Shape shapes[] = {{1, 100, 4, 2, 64, Seg::kPacked, false, 0, 1.f}, {1, 70, 4, 1, 128, Seg::kNone, true, 0, 1.f}};
  for (const Shape& s : shapes) {
    const unsigned seed = seed_for(s, 3);
    print_case("determinism", s, seed);
    Case k(s);
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);
    lt::cuda::attention_backward_cuda(p, nullptr);
    const Heads dqkv1 = k.dqkv_buf, dk1 = k.dk_buf, dv1 = k.dv_buf;
    const std::vector<float> dsum1 = k.dsum;
    const __nv_bfloat16 nan = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
    for (Heads* h : {&k.dqkv_buf, &k.dk_buf, &k.dv_buf})
      for (int r = 0; r < h->rows; ++r)
        for (int hh = 0; hh < h->NH; ++hh)
          for (int c = 0; c < h->hd; ++c) h->data[h->index(r, hh, c)] = nan;
    for (size_t i = 0; i + kPad < k.dsum.size(); ++i) k.dsum[i] = std::numeric_limits<float>::quiet_NaN();
    lt::cuda::attention_backward_cuda(p, nullptr);
    const auto same = [](const Heads& a, const Heads& b) {
      return a.data.size() == b.data.size() &&
             std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(__nv_bfloat16)) == 0;
    };
    EXPECT_TRUE(same(dqkv1, k.dqkv_buf)) << "dq differs between runs";
    EXPECT_TRUE(same(dk1, k.dk_buf)) << "dk differs between runs";
    EXPECT_TRUE(same(dv1, k.dv_buf)) << "dv differs between runs";
    EXPECT_EQ(std::memcmp(dsum1.data(), k.dsum.data(), dsum1.size() * sizeof(float)), 0) << "dsum differs";
  }
}

TEST(AttentionSim, RejectsUnsupportedArguments) {
  Case k({1, 8, 2, 1, 32, Seg::kNone, false, 0, 1.f});
  make_inputs(k, 7);
  AttentionParams p = k.params();
  p.hd = 96;
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  EXPECT_THROW(lt::cuda::attention_backward_cuda(p, nullptr), std::invalid_argument);
  try {
    lt::cuda::attention_forward_cuda(p, nullptr);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
  p = k.params();
  p.KVH = 3;
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.q.token_stride += 4;  // not a multiple of 8 elements: 16-byte vectors would be misaligned
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.k.ptr += 1;
  EXPECT_THROW(lt::cuda::attention_backward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.dsum = nullptr;
  EXPECT_THROW(lt::cuda::attention_backward_cuda(p, nullptr), std::invalid_argument);
  // Nothing was written by the rejected calls.
  EXPECT_EQ(k.lse[0], kSentinel);
}

}  // namespace
