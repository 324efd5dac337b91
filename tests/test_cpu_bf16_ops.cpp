// The bf16 path's AVX-512 ops (ops_bf16.h, attention_onednn.h, avx512.h) against the CPU backend's
// fp32 reference ops (ops_cpu.h) on odd shapes (no size a multiple of 16, so every masked tail
// runs), each case seeded with a printed seed. Tolerances: fp32 outputs within 2e-6 relative to the
// reference's largest magnitude (the polynomial exp is within 2 ulp; sums run in another order),
// bf16 outputs within one bf16 rounding (2^-8 relative) of the rounded reference. Skipped where the
// CPU has no AVX-512 (the ops then run their scalar twins, which are the code they replaced).
#include "backend/cpu/avx512.h"  // first: its pragma precedes <immintrin.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/onednn/attention_onednn.h"
#include "backend/cpu/onednn/bf16.h"
#include "backend/cpu/onednn/ops_bf16.h"
#include "backend/cpu/onednn/matmul_onednn.h"
#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace {

using lt::cpu::bf16;
using lt::cpu::bf16_to_float;
using lt::cpu::float_to_bf16;

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// max_i |a_i - b_i| / max_i |b_i|, the worst element against the reference's scale.
double rel_max_err(const float* a, const float* b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? err / scale : err;
}

// The worst |a - bf16(b)| in units of b's bf16 spacing (1 = one rounding step apart).
double bf16_steps(const bf16* a, const float* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float rb = bf16_to_float(float_to_bf16(b[i]));
    const float step = std::max(std::fabs(rb) * 0x1p-7f, 1e-30f);
    worst = std::max(worst, std::fabs(double(bf16_to_float(a[i])) - rb) / step);
  }
  return worst;
}

LT_AVX512 void exp16(float* y, const float* x) { _mm512_storeu_ps(y, lt::cpu::avx512::exp(_mm512_loadu_ps(x))); }
LT_AVX512 void to_bf16_16(bf16* y, const float* x) { lt::cpu::avx512::store_bf16(y, _mm512_loadu_ps(x)); }

#define SKIP_WITHOUT_AVX512() \
  if (!lt::cpu::avx512::has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512"

bool onednn_loads() {
  try {
    (void)lt::cpu::onednn::has_amx();
    return true;
  } catch (const lt::Error& e) {
    std::printf("oneDNN unavailable: %s\n", e.what());
    return false;
  }
}
#define ONEDNN_OR_SKIP() \
  if (!onednn_loads()) GTEST_SKIP() << "oneDNN cannot be loaded"

TEST(CpuBf16Ops, ExpAndBf16RoundingMatchScalar) {
  SKIP_WITHOUT_AVX512();
  // exp over [-110, 90] against std::exp in double: within 3e-7 relative where the result is a
  // normal float, 0 below the underflow, inf above the overflow.
  std::vector<float> x, y(16);
  for (float v = -110.f; v <= 90.f; v += 0.0137f) x.push_back(v);
  x.resize((x.size() + 15) / 16 * 16, 0.f);
  double worst = 0;
  for (size_t i = 0; i < x.size(); i += 16) {
    exp16(y.data(), x.data() + i);
    for (int l = 0; l < 16; ++l) {
      const double ref = std::exp(double(x[i + l]));
      const double kMax = std::numeric_limits<float>::max();
      if (ref > kMax * 1.000001) {
        EXPECT_TRUE(std::isinf(y[l])) << x[i + l];
      } else if (ref > kMax * 0.999999) {
        continue;  // at the overflow threshold either answer is a correct rounding
      } else if (ref >= 1.2e-38) {
        worst = std::max(worst, std::fabs(y[l] - ref) / ref);
      } else {
        EXPECT_LE(y[l], 1.2e-38f) << x[i + l];
      }
    }
  }
  std::printf("exp: worst relative error %.3g over [-110, 90]\n", worst);
  EXPECT_LT(worst, 3e-7);
  float special[16] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::infinity(), 0.f};
  exp16(y.data(), special);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.f);
  EXPECT_TRUE(std::isinf(y[2]));
  EXPECT_EQ(y[3], 1.f);

  // bf16 rounding: bit-identical to float_to_bf16 on random bit patterns (ties, NaNs, infinities,
  // subnormals included).
  const uint32_t seed = 19;
  std::mt19937 rng(seed);
  std::vector<float> f(4096);
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u = rng();
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // an exact tie
    if (i % 97 == 3) u |= 0x7f800000u;                 // inf or NaN
    std::memcpy(&f[i], &u, 4);
  }
  std::vector<bf16> h(16);
  for (size_t i = 0; i < f.size(); i += 16) {
    to_bf16_16(h.data(), f.data() + i);
    for (int l = 0; l < 16; ++l) ASSERT_EQ(h[l], float_to_bf16(f[i + l])) << "seed " << seed << " element " << i + l;
  }
}

TEST(CpuBf16Ops, ElementwiseMatchFp32Reference) {
  SKIP_WITHOUT_AVX512();
  const uint32_t seed = 1919;
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int N = 7, C = 37, F = 45, V = 101;

  // RMSNorm forward and backward.
  const auto x = randn(size_t(N) * C, rng), w = randn(C, rng), g = randn(size_t(N) * C, rng);
  std::vector<float> out(x.size()), out_ref(x.size()), rstd(N), rstd_ref(N);
  std::vector<bf16> out_b(x.size());
  lt::cpu::rmsnorm_forward(out_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, 1e-5f);
  lt::cpu::rmsnorm_forward_bf16(out.data(), out_b.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  EXPECT_LT(rel_max_err(out.data(), out_ref.data(), out.size()), 2e-6);
  EXPECT_LT(rel_max_err(rstd.data(), rstd_ref.data(), N), 2e-6);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out_b[i], float_to_bf16(out[i])) << i;
  std::vector<float> dx(x.size()), dx_ref(x.size()), dw(C, 0.5f), dw_ref(C, 0.5f);
  lt::cpu::rmsnorm_backward(dx_ref.data(), dw_ref.data(), g.data(), x.data(), w.data(), rstd_ref.data(), N, C);
  lt::cpu::rmsnorm_backward_avx512(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd_ref.data(), N, C);
  EXPECT_LT(rel_max_err(dx.data(), dx_ref.data(), dx.size()), 2e-6);
  EXPECT_LT(rel_max_err(dw.data(), dw_ref.data(), C), 2e-6);

  // SwiGLU forward and backward (h1 over a wide range, so that exp's both tails are used).
  auto h1 = randn(size_t(N) * F, rng, 6.f), h3 = randn(size_t(N) * F, rng), dh = randn(size_t(N) * F, rng);
  h1[0] = -100.f, h1[1] = 100.f;
  std::vector<float> hs(h1.size()), hs_ref(h1.size()), dh1_ref(h1.size()), dh3_ref(h1.size());
  std::vector<bf16> hs_b(h1.size()), dh1_b(h1.size()), dh3_b(h1.size());
  lt::cpu::swiglu_forward(hs_ref.data(), h1.data(), h3.data(), N, F);
  lt::cpu::swiglu_forward_bf16(hs.data(), hs_b.data(), h1.data(), h3.data(), N, F);
  EXPECT_LT(rel_max_err(hs.data(), hs_ref.data(), hs.size()), 2e-6);
  EXPECT_LE(bf16_steps(hs_b.data(), hs_ref.data(), hs.size()), 1.0);
  lt::cpu::swiglu_backward(dh1_ref.data(), dh3_ref.data(), dh.data(), h1.data(), h3.data(), N, F);
  lt::cpu::swiglu_backward_bf16(dh1_b.data(), dh3_b.data(), dh.data(), h1.data(), h3.data(), N, F);
  EXPECT_LE(bf16_steps(dh1_b.data(), dh1_ref.data(), h1.size()), 1.0);
  EXPECT_LE(bf16_steps(dh3_b.data(), dh3_ref.data(), h1.size()), 1.0);

  // RoPE forward and backward, with and without explicit positions, in place as the pass runs it;
  // head_dim 36 (two full vectors' worth would be 32: a masked tail).
  {
    const int B = 2, Tn = 9, H = 3, hd = 36;
    const auto xr = randn(size_t(B) * Tn * H * hd, rng);
    std::vector<int32_t> pos(size_t(B) * Tn);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t((i * 5) % 17);
    for (const int32_t* p : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(pos.data())}) {
      std::vector<float> ref(xr.size()), got = xr, bref(xr.size()), bgot = xr;
      lt::cpu::rope_forward(ref.data(), xr.data(), p, B, Tn, H, hd, 10000.f);
      lt::cpu::rope_forward_avx512(got.data(), got.data(), p, B, Tn, H, hd, 10000.f);
      EXPECT_LT(rel_max_err(got.data(), ref.data(), ref.size()), 2e-6) << (p ? "positions" : "t");
      lt::cpu::rope_backward(bref.data(), xr.data(), p, B, Tn, H, hd, 10000.f);
      lt::cpu::rope_backward_avx512(bgot.data(), bgot.data(), p, B, Tn, H, hd, 10000.f);
      EXPECT_LT(rel_max_err(bgot.data(), bref.data(), bref.size()), 2e-6) << (p ? "positions" : "t");
    }
  }

  // Residual add: exact.
  std::vector<float> r(x.size()), r_ref(x.size());
  lt::cpu::residual_add(r_ref.data(), x.data(), g.data(), x.size());
  lt::cpu::residual_add_avx512(r.data(), x.data(), g.data(), x.size());
  EXPECT_EQ(r, r_ref);

  // Cross-entropy: a masked row, one row with a logit far above the rest.
  auto logits = randn(size_t(N) * V, rng, 3.f);
  logits[size_t(2) * V + 50] = 80.f;
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[size_t(i)] = int32_t(rng() % V);
  std::vector<uint8_t> mask(N, 1);
  mask[3] = 0;
  std::vector<float> losses(N), losses_ref(N), lse(N), lse_ref(N), row_max(N), target_logit(N);
  std::vector<bf16> e(logits.size()), d_plain(logits.size());
  const double sum_ref = lt::cpu::crossentropy_forward(losses_ref.data(), lse_ref.data(), logits.data(), targets.data(),
                                                       mask.data(), N, V);
  const double sum = lt::cpu::crossentropy_forward_bf16(losses.data(), lse.data(), e.data(), row_max.data(),
                                                        target_logit.data(), logits.data(), targets.data(), mask.data(),
                                                        N, V);
  EXPECT_NEAR(sum, sum_ref, 2e-6 * std::fabs(sum_ref));
  EXPECT_LT(rel_max_err(losses.data(), losses_ref.data(), N), 2e-6);
  EXPECT_LT(rel_max_err(lse.data(), lse_ref.data(), N), 2e-6);
  for (int i = 0; i < N; ++i) EXPECT_EQ(target_logit[size_t(i)], mask[size_t(i)] ? logits[size_t(i) * V + targets[size_t(i)]] : 0.f);
  std::vector<float> dlogits_ref(logits.size());
  lt::cpu::crossentropy_backward(dlogits_ref.data(), logits.data(), lse_ref.data(), targets.data(), mask.data(), 0.25f,
                                 N, V);
  lt::cpu::crossentropy_backward_from_exp_bf16(e.data(), target_logit.data(), lse.data(), row_max.data(),
                                               targets.data(), mask.data(), 0.25f, N, V);
  lt::cpu::crossentropy_backward_bf16(d_plain.data(), logits.data(), lse.data(), targets.data(), mask.data(), 0.25f,
                                      N, V);
  // From the kept exp: two bf16 roundings (the exp, then the scaled value).
  EXPECT_LE(bf16_steps(e.data(), dlogits_ref.data(), e.size()), 2.0);
  EXPECT_LE(bf16_steps(d_plain.data(), dlogits_ref.data(), e.size()), 1.0);

  // From bf16 logits (in place): the fp32 reference on the same rounded values.
  {
    std::vector<bf16> lb(logits.size());
    std::vector<float> rounded(logits.size());
    for (size_t i = 0; i < lb.size(); ++i) lb[i] = float_to_bf16(logits[i]), rounded[i] = bf16_to_float(lb[i]);
    std::vector<float> l2(N), s2(N), l2_ref(N), s2_ref(N), m2(N), t2(N);
    const double r_ref = lt::cpu::crossentropy_forward(l2_ref.data(), s2_ref.data(), rounded.data(), targets.data(),
                                                       mask.data(), N, V);
    const double r = lt::cpu::crossentropy_forward_from_bf16(l2.data(), s2.data(), lb.data(), m2.data(), t2.data(),
                                                             targets.data(), mask.data(), N, V);
    EXPECT_NEAR(r, r_ref, 2e-6 * std::fabs(r_ref));
    EXPECT_LT(rel_max_err(l2.data(), l2_ref.data(), N), 2e-6);
    std::vector<float> d2_ref(logits.size());
    lt::cpu::crossentropy_backward(d2_ref.data(), rounded.data(), s2_ref.data(), targets.data(), mask.data(), 0.25f,
                                   N, V);
    lt::cpu::crossentropy_backward_from_exp_bf16(lb.data(), t2.data(), s2.data(), m2.data(), targets.data(), mask.data(),
                                                 0.25f, N, V);
    EXPECT_LE(bf16_steps(lb.data(), d2_ref.data(), lb.size()), 2.0);
  }
  for (int j = 0; j < V; ++j) EXPECT_EQ(e[size_t(3) * V + j], 0) << "masked row";
}

// adamw_update on AVX-512 is bit-identical to the scalar formula (ops_cpu.h), tail included.
TEST(CpuBf16Ops, AdamwIsBitIdenticalToScalar) {
  const uint32_t seed = 5;
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const size_t n = 1000 + 7;
  auto p = randn(n, rng), m = randn(n, rng, 0.01f), v = randn(n, rng, 0.01f);
  const auto g = randn(n, rng, 0.1f);
  for (auto& x : v) x = std::fabs(x);
  auto p_ref = p, m_ref = m, v_ref = v;
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const int t = 3;
  const float bc1 = float(1.0 - std::pow(double(b1), t)), bc2 = float(1.0 - std::pow(double(b2), t));
  for (size_t i = 0; i < n; ++i) {
    const float mi = b1 * m_ref[i] + (1.0f - b1) * g[i];
    const float vi = b2 * v_ref[i] + (1.0f - b2) * g[i] * g[i];
    m_ref[i] = mi, v_ref[i] = vi;
    const float m_hat = mi / bc1, v_hat = vi / bc2;
    p_ref[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p_ref[i]);
  }
  lt::cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n, lr, b1, b2, eps, wd, t);
  EXPECT_EQ(p, p_ref);
  EXPECT_EQ(m, m_ref);
  EXPECT_EQ(v, v_ref);
}

// attention_onednn.h against the reference (ops_cpu.h), with GQA, packed examples, a sequence length
// that is not a multiple of the 64-row blocks and a head size that is not a multiple of 16.
struct AttentionCase {
  static constexpr int B = 2, Tn = 131, H = 4, KVH = 2, hd = 12;
  static constexpr size_t nq = size_t(B) * Tn * H * hd, nk = size_t(B) * Tn * KVH * hd, nl = size_t(B) * H * Tn;
  std::vector<float> q, k, v, dout;
  std::vector<int32_t> seg = std::vector<int32_t>(size_t(B) * Tn, 0);
  explicit AttentionCase(uint32_t seed) {
    std::mt19937 rng(seed);
    q = randn(nq, rng), k = randn(nk, rng), v = randn(nk, rng), dout = randn(nq, rng);
    for (int t = 0; t < Tn; ++t) seg[size_t(Tn) + t] = t < 40 ? 0 : t < 100 ? 40 : 100;  // row 1: three examples
  }
  // out, lse, dq, dk, dv of the attention `fwd`/`bwd` on inputs of type T (converted from q, k, v, dout,
  // each rounded to bf16 first when round_inputs), as doubles.
  template <class T, class Fwd, class Bwd>
  std::vector<std::vector<double>> run(Fwd fwd, Bwd bwd, bool round_inputs = false) const {
    auto conv = [&](const std::vector<float>& x) {
      std::vector<T> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = T(round_inputs ? bf16_to_float(float_to_bf16(x[i])) : x[i]);
      return y;
    };
    const auto tq = conv(q), tk = conv(k), tv = conv(v), tdo = conv(dout);
    std::vector<T> out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    fwd(out.data(), lse.data(), tq.data(), tk.data(), tv.data(), seg.data(), B, Tn, H, KVH, hd);
    bwd(dq.data(), dk.data(), dv.data(), tdo.data(), out.data(), lse.data(), tq.data(), tk.data(), tv.data(),
        seg.data(), B, Tn, H, KVH, hd);
    std::vector<std::vector<double>> r;
    for (const auto* x : {&out, &lse, &dq, &dk, &dv}) r.emplace_back(x->begin(), x->end());
    return r;
  }
};

double rel_max_err(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return err / scale;
}

using lt::cpu::AttentionProducts;
const char* const kAttentionOutputs[] = {"out", "lse", "dq", "dk", "dv"};

// The fp32-product variant (CPUs without AMX): the reference's arithmetic in another order.
TEST(CpuBf16Ops, AttentionFp32ProductsMatchReference) {
  SKIP_WITHOUT_AVX512();
  ONEDNN_OR_SKIP();
  const uint32_t seed = 7;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const AttentionCase c(seed);
  const auto ref = c.run<float>(lt::cpu::attention_forward<float>, lt::cpu::attention_backward<float>);
  const auto got = c.run<float>(
      [](auto... a) { lt::cpu::attention_forward_onednn(a..., AttentionProducts::kFp32); },
      [](auto... a) { lt::cpu::attention_backward_onednn(a..., AttentionProducts::kFp32); });
  for (int i = 0; i < 5; ++i) EXPECT_LT(rel_max_err(got[i], ref[i]), 1e-5) << kAttentionOutputs[i];
}

// The bf16-product variant against fp64: STYLE.md's rule for low precision, its worst error at most
// 2x that of a naive kernel in the same precision (fp32 attention on bf16-rounded q, k, v, dO; ours
// also rounds P and dS), with a floor of 2^-8 for outputs the input rounding barely moves.
TEST(CpuBf16Ops, AttentionBf16ProductsWithinTwiceNaiveBf16Error) {
  SKIP_WITHOUT_AVX512();
  ONEDNN_OR_SKIP();
  const uint32_t seed = 7;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const AttentionCase c(seed);
  const auto exact = c.run<double>(lt::cpu::attention_forward<double>, lt::cpu::attention_backward<double>);
  const auto naive =
      c.run<float>(lt::cpu::attention_forward<float>, lt::cpu::attention_backward<float>, /*round_inputs=*/true);
  const auto got = c.run<float>(
      [](auto... a) { lt::cpu::attention_forward_onednn(a..., AttentionProducts::kBf16); },
      [](auto... a) { lt::cpu::attention_backward_onednn(a..., AttentionProducts::kBf16); });
  for (int i = 0; i < 5; ++i) {
    const double e = rel_max_err(got[i], exact[i]), e_naive = rel_max_err(naive[i], exact[i]);
    std::printf("attention bf16 %-3s: worst error %.3g, naive bf16 %.3g (relative to the largest element)\n",
                kAttentionOutputs[i], e, e_naive);
    EXPECT_LE(e, std::max(2 * e_naive, 0x1p-8)) << kAttentionOutputs[i];
  }
}

}  // namespace
