// Tests of the CPU backend op set (include/llamatrain/ops_cpu.h), the reference every other
// backend is compared with:
//  * every backward op against central finite differences in double on tiny shapes,
//  * float against double for every op on sizes that are not multiples of 4/8/16 or of the
//    attention row block, with outputs pre-filled with NaN so unwritten elements show up,
//  * attention against a naive masked-softmax reference, and a packed row (positions restarting,
//    seg_start) against each of its examples run alone,
//  * AdamW against a hand-computed step, sum_squares, masked cross-entropy, aliasing, `+=`
//    accumulation and determinism across thread counts.
// Random inputs come from one printed seed (override with LLAMATRAIN_TEST_SEED to replay).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

constexpr uint64_t kDefaultSeed = 20240611;
constexpr float kTheta = 10000.0f;

// Uniform doubles from raw mt19937_64 bits (std::uniform_real_distribution is not specified
// bit-for-bit across standard libraries, the engine is).
class Rng {
 public:
  void reseed(uint64_t seed) { gen_.seed(seed); }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(gen_() >> 11) * 0x1.0p-53);
  }
  int below(int n) { return static_cast<int>(gen_() % static_cast<uint64_t>(n)); }
  // Values representable in float, so float and double runs see identical inputs.
  std::vector<double> vec(size_t n, double lo = -1.0, double hi = 1.0) {
    std::vector<double> v(n);
    for (double& x : v) x = static_cast<float>(uniform(lo, hi));
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

class OpsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = kDefaultSeed;
    if (const char* s = std::getenv("LLAMATRAIN_TEST_SEED")) seed_ = std::stoull(s);
    RecordProperty("seed", std::to_string(seed_));
    std::cout << "seed=" << seed_ << " (replay with LLAMATRAIN_TEST_SEED=" << seed_ << ")\n";
    rng_.reseed(seed_);
  }
  uint64_t seed_ = 0;
  Rng rng_;
};

// ---- helpers -----------------------------------------------------------------------------

template <class T>
std::vector<T> cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <class T>
std::vector<T> nan_filled(size_t n) {
  return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// fp32 tolerance relative to the magnitude of the result, growing with the reduction length.
double fp32_tol(int reduction_length) {
  return 1e-5 * std::max(1.0, reduction_length / 128.0);
}

// Expects |got_i - ref_i| <= tol * (|ref_i| + max(rms(ref), floor)) for every element and reports
// the worst element. The rms term judges elements that cancel to ~0 against the typical magnitude;
// `floor` is that magnitude when the whole reference may be ~0 (e.g. a gradient that vanishes
// mathematically and holds only rounding noise).
template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<double>& ref,
                  double tol, double floor = 0.0) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double ss = 0.0;
  for (double r : ref) ss += r * r;
  const double rms = std::max(floor, ref.empty() ? 0.0 : std::sqrt(ss / ref.size()));
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    double ratio = std::abs(g - ref[i]) / (tol * (std::abs(ref[i]) + rms) + 1e-300);
    if (!std::isfinite(g) && !(std::isinf(g) && g == ref[i])) ratio = INFINITY;
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst element " << worst_i << " got " << got[worst_i]
                        << " expected " << ref[worst_i] << " (tolerance " << tol
                        << " x (|ref| + rms " << rms << "))";
}

// Restores the OpenMP thread count a test changed.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(omp_get_max_threads()) {}
  ~ThreadCountGuard() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

struct GradInput {
  std::string name;
  std::vector<double>* x;        // perturbed in place by the check
  std::vector<double> analytic;  // d objective / d x from the backward op
};

// Central differences (L(x+h) - L(x-h)) / 2h for every element of every input, against the
// analytic gradient: |a - n| <= atol + rtol max(|a|, |n|). With h = 1e-5 in double the truncation
// error is ~h^2 = 1e-10 and the rounding error ~1e-16 |L| / h = 1e-11 |L|, far below the tolerance;
// a wrong formula is off by far more.
void expect_gradients(const std::string& op, std::vector<GradInput> inputs,
                      const std::function<double()>& objective) {
  constexpr double kStep = 1e-5, kRtol = 1e-6, kAtol = 1e-8;
  // Thousands of tiny evaluations: one thread avoids waking a team per call on a busy machine.
  // The analytic gradients were computed by the caller with the default thread count.
  ThreadCountGuard guard;
  omp_set_num_threads(1);
  for (GradInput& in : inputs) {
    ASSERT_EQ(in.x->size(), in.analytic.size()) << op << " d" << in.name;
    double worst = -1.0, worst_a = 0.0, worst_n = 0.0, max_abs = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < in.x->size(); ++i) {
      double& xi = (*in.x)[i];
      const double saved = xi;
      xi = saved + kStep;
      const double lp = objective();
      xi = saved - kStep;
      const double lm = objective();
      xi = saved;
      const double num = (lp - lm) / (2 * kStep);
      const double a = in.analytic[i];
      double ratio = std::abs(a - num) / (kAtol + kRtol * std::max(std::abs(a), std::abs(num)));
      if (!std::isfinite(a) || !std::isfinite(num)) ratio = INFINITY;
      if (ratio > worst) {
        worst = ratio;
        worst_i = i;
        worst_a = a;
        worst_n = num;
      }
      max_abs = std::max(max_abs, std::abs(num));
    }
    EXPECT_LE(worst, 1.0) << op << " d" << in.name << ": worst element " << worst_i
                          << " analytic " << worst_a << " numeric " << worst_n
                          << " (|a-n| / (atol + rtol max) = " << worst << ")";
    // A gradient that vanishes everywhere would make the comparison vacuous.
    EXPECT_GT(max_abs, 1e-3) << op << " d" << in.name << " is ~0 everywhere";
  }
}

// seg_start for packed rows: example boundaries per batch row, seg_start[t] = start of t's example.
std::vector<int32_t> make_seg_start(const std::vector<std::vector<int>>& lengths) {
  std::vector<int32_t> seg;
  for (const auto& row : lengths) {
    int start = 0;
    for (int len : row) {
      for (int i = 0; i < len; ++i) seg.push_back(start);
      start += len;
    }
  }
  return seg;
}

// Positions that restart at every example boundary, as the data loader produces them.
std::vector<int32_t> make_positions(const std::vector<std::vector<int>>& lengths) {
  std::vector<int32_t> pos;
  for (const auto& row : lengths)
    for (int len : row)
      for (int i = 0; i < len; ++i) pos.push_back(i);
  return pos;
}

struct AttnShape {
  int B, Tn, H, KVH, hd;
  bool segments;
};

// Random example lengths (1..max_len) filling each of B rows of Tn tokens.
std::vector<std::vector<int>> random_lengths(Rng& rng, int B, int Tn, int max_len) {
  std::vector<std::vector<int>> lengths(B);
  for (auto& row : lengths) {
    int left = Tn;
    while (left > 0) {
      const int len = std::min(left, 1 + rng.below(max_len));
      row.push_back(len);
      left -= len;
    }
  }
  return lengths;
}

// Naive attention in double: explicit masked softmax per (b, h, t).
void naive_attention_forward(std::vector<double>& out, std::vector<double>& lse,
                             const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const int32_t* seg, const AttnShape& s) {
  const int group = s.H / s.KVH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  out.assign(static_cast<size_t>(s.B) * s.Tn * s.H * s.hd, 0.0);
  lse.assign(static_cast<size_t>(s.B) * s.H * s.Tn, 0.0);
  std::vector<double> p(s.Tn);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int t = 0; t < s.Tn; ++t) {
        const int g = h / group, s0 = seg ? seg[b * s.Tn + t] : 0;
        const double* qt = &q[((static_cast<size_t>(b) * s.Tn + t) * s.H + h) * s.hd];
        double mx = -INFINITY;
        for (int j = s0; j <= t; ++j) {
          const double* kj = &k[((static_cast<size_t>(b) * s.Tn + j) * s.KVH + g) * s.hd];
          double acc = 0.0;
          for (int c = 0; c < s.hd; ++c) acc += qt[c] * kj[c];
          p[j] = acc * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int j = s0; j <= t; ++j) sum += std::exp(p[j] - mx);
        lse[(static_cast<size_t>(b) * s.H + h) * s.Tn + t] = mx + std::log(sum);
        double* ot = &out[((static_cast<size_t>(b) * s.Tn + t) * s.H + h) * s.hd];
        for (int j = s0; j <= t; ++j) {
          const double w = std::exp(p[j] - mx) / sum;
          const double* vj = &v[((static_cast<size_t>(b) * s.Tn + j) * s.KVH + g) * s.hd];
          for (int c = 0; c < s.hd; ++c) ot[c] += w * vj[c];
        }
      }
}

// Naive attention backward in double, written from the softmax Jacobian directly:
// dP_ts = dO_t.v_s, dS_ts = P_ts (dP_ts - sum_u P_tu dP_tu).
void naive_attention_backward(std::vector<double>& dq, std::vector<double>& dk,
                              std::vector<double>& dv, const std::vector<double>& dout,
                              const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const int32_t* seg,
                              const AttnShape& s) {
  const int group = s.H / s.KVH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  std::vector<double> out, lse;
  naive_attention_forward(out, lse, q, k, v, seg, s);
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  std::vector<double> p(s.Tn), dp(s.Tn);
  auto qi = [&](int b, int t, int h) { return ((static_cast<size_t>(b) * s.Tn + t) * s.H + h) * s.hd; };
  auto ki = [&](int b, int t, int g) { return ((static_cast<size_t>(b) * s.Tn + t) * s.KVH + g) * s.hd; };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int t = 0; t < s.Tn; ++t) {
        const int g = h / group, s0 = seg ? seg[b * s.Tn + t] : 0;
        const double l = lse[(static_cast<size_t>(b) * s.H + h) * s.Tn + t];
        double pdp = 0.0;
        for (int j = s0; j <= t; ++j) {
          double acc = 0.0, acc_v = 0.0;
          for (int c = 0; c < s.hd; ++c) {
            acc += q[qi(b, t, h) + c] * k[ki(b, j, g) + c];
            acc_v += dout[qi(b, t, h) + c] * v[ki(b, j, g) + c];
          }
          p[j] = std::exp(acc * scale - l);
          dp[j] = acc_v;
          pdp += p[j] * dp[j];
        }
        for (int j = s0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - pdp);
          for (int c = 0; c < s.hd; ++c) {
            dv[ki(b, j, g) + c] += p[j] * dout[qi(b, t, h) + c];
            dq[qi(b, t, h) + c] += scale * ds * k[ki(b, j, g) + c];
            dk[ki(b, j, g) + c] += scale * ds * q[qi(b, t, h) + c];
          }
        }
      }
}

// ---- 1. backward ops against finite differences (double) -------------------------------

TEST_F(OpsCpu, EmbeddingBackwardMatchesFiniteDifferences) {
  const int N = 7, C = 9, V = 11;
  const std::vector<int32_t> tokens = {3, 1, 3, 7, 3, 0, 1};  // repeated ids must accumulate
  std::vector<double> wte = rng_.vec(static_cast<size_t>(V) * C);
  const std::vector<double> dout = rng_.vec(static_cast<size_t>(N) * C);
  auto objective = [&] {
    std::vector<double> out = nan_filled<double>(static_cast<size_t>(N) * C);
    embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
    return dot(dout, out);
  };
  const std::vector<double> dwte0 = rng_.vec(wte.size());
  std::vector<double> dwte = dwte0;
  embedding_backward(dwte.data(), dout.data(), tokens.data(), N, V, C);
  expect_gradients("embedding", {{"wte", &wte, minus(dwte, dwte0)}}, objective);
}

TEST_F(OpsCpu, RmsnormBackwardMatchesFiniteDifferences) {
  const int N = 7, C = 9;
  const float eps = 1e-5f;
  std::vector<double> x = rng_.vec(static_cast<size_t>(N) * C, -2.0, 2.0);
  std::vector<double> w = rng_.vec(C, 0.5, 1.5);
  const std::vector<double> dout = rng_.vec(x.size());
  auto objective = [&] {
    std::vector<double> out = nan_filled<double>(x.size()), rstd = nan_filled<double>(N);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(dout, out);
  };
  std::vector<double> out(x.size()), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  std::vector<double> dx = nan_filled<double>(x.size());
  const std::vector<double> dw0 = rng_.vec(C);
  std::vector<double> dw = dw0;
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_gradients("rmsnorm", {{"x", &x, dx}, {"w", &w, minus(dw, dw0)}}, objective);
}

TEST_F(OpsCpu, MatmulBackwardMatchesFiniteDifferences) {
  const int N = 7, IC = 9, OC = 10;
  std::vector<double> x = rng_.vec(static_cast<size_t>(N) * IC);
  std::vector<double> w = rng_.vec(static_cast<size_t>(OC) * IC);
  const std::vector<double> dout = rng_.vec(static_cast<size_t>(N) * OC);
  auto objective = [&] {
    std::vector<double> out = nan_filled<double>(dout.size());
    matmul_forward(out.data(), x.data(), w.data(), N, IC, OC);
    return dot(dout, out);
  };
  std::vector<double> dx = nan_filled<double>(x.size());
  const std::vector<double> dw0 = rng_.vec(w.size());
  std::vector<double> dw = dw0;
  matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  // dx may be null (first layer): dw must come out the same.
  std::vector<double> dw_only = dw0;
  matmul_backward<double>(nullptr, dw_only.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(dw_only, dw);
  expect_gradients("matmul", {{"x", &x, dx}, {"w", &w, minus(dw, dw0)}}, objective);
}

TEST_F(OpsCpu, RopeBackwardMatchesFiniteDifferences) {
  const int B = 2, Tn = 5, H = 4, hd = 6;
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 5, 6, 0, 1, 2};  // restarts inside rows
  for (const int32_t* p : std::vector<const int32_t*>{pos.data(), nullptr}) {
    SCOPED_TRACE(p ? "pos given" : "pos null");
    std::vector<double> x = rng_.vec(static_cast<size_t>(B) * Tn * H * hd);
    const std::vector<double> dout = rng_.vec(x.size());
    auto objective = [&] {
      std::vector<double> out = nan_filled<double>(x.size());
      rope_forward(out.data(), x.data(), p, B, Tn, H, hd, kTheta);
      return dot(dout, out);
    };
    std::vector<double> dx = nan_filled<double>(x.size());
    rope_backward(dx.data(), dout.data(), p, B, Tn, H, hd, kTheta);
    expect_gradients("rope", {{"x", &x, dx}}, objective);
  }
}

TEST_F(OpsCpu, AttentionBackwardMatchesFiniteDifferences) {
  struct Case {
    AttnShape shape;
    std::vector<std::vector<int>> lengths;  // examples per row; empty: seg_start null
  };
  const std::vector<Case> cases = {
      {{2, 5, 4, 2, 6, true}, {{3, 2}, {2, 3}}},  // GQA, two examples per row
      {{2, 5, 4, 4, 6, false}, {}},               // plain multi-head, no segments
      {{2, 5, 4, 1, 6, true}, {{1, 4}, {4, 1}}},  // multi-query
      // Crosses the 64-row query block; the last block's keys start in an earlier example.
      {{1, 70, 2, 1, 4, true}, {{30, 36, 4}}},
  };
  for (const Case& c : cases) {
    const AttnShape& s = c.shape;
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.Tn << " H=" << s.H
                                    << " KVH=" << s.KVH << " hd=" << s.hd);
    const std::vector<int32_t> seg = make_seg_start(c.lengths);
    const int32_t* seg_ptr = c.lengths.empty() ? nullptr : seg.data();
    const size_t nq = static_cast<size_t>(s.B) * s.Tn * s.H * s.hd;
    const size_t nkv = static_cast<size_t>(s.B) * s.Tn * s.KVH * s.hd;
    std::vector<double> q = rng_.vec(nq, -1.5, 1.5), k = rng_.vec(nkv, -1.5, 1.5),
                        v = rng_.vec(nkv);
    const std::vector<double> dout = rng_.vec(nq);
    const size_t nlse = static_cast<size_t>(s.B) * s.H * s.Tn;
    auto objective = [&] {
      std::vector<double> out = nan_filled<double>(nq), lse = nan_filled<double>(nlse);
      attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg_ptr, s.B, s.Tn,
                        s.H, s.KVH, s.hd);
      return dot(dout, out);
    };
    std::vector<double> out(nq), lse(nlse);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg_ptr, s.B, s.Tn, s.H,
                      s.KVH, s.hd);
    std::vector<double> dq = nan_filled<double>(nq), dk = nan_filled<double>(nkv),
                        dv = nan_filled<double>(nkv);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), seg_ptr, s.B, s.Tn, s.H, s.KVH, s.hd);
    expect_gradients("attention", {{"q", &q, dq}, {"k", &k, dk}, {"v", &v, dv}}, objective);
  }
}

TEST_F(OpsCpu, SwigluBackwardMatchesFiniteDifferences) {
  const int N = 7, F = 10;
  std::vector<double> h1 = rng_.vec(static_cast<size_t>(N) * F, -4.0, 4.0);
  std::vector<double> h3 = rng_.vec(h1.size());
  const std::vector<double> dout = rng_.vec(h1.size());
  auto objective = [&] {
    std::vector<double> out = nan_filled<double>(h1.size());
    swiglu_forward(out.data(), h1.data(), h3.data(), N, F);
    return dot(dout, out);
  };
  std::vector<double> dh1 = nan_filled<double>(h1.size()), dh3 = nan_filled<double>(h1.size());
  swiglu_backward(dh1.data(), dh3.data(), dout.data(), h1.data(), h3.data(), N, F);
  expect_gradients("swiglu", {{"h1", &h1, dh1}, {"h3", &h3, dh3}}, objective);
}

TEST_F(OpsCpu, CrossentropyBackwardMatchesFiniteDifferences) {
  const int N = 7, V = 11;
  const float dloss = 0.2f;  // 1 / (number of loss tokens) in training; any scale works here
  std::vector<double> logits = rng_.vec(static_cast<size_t>(N) * V, -3.0, 3.0);
  std::vector<int32_t> targets(N);
  for (int32_t& t : targets) t = rng_.below(V);
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 1, 1};
  targets[1] = -1;  // a masked row may carry a padding target
  auto objective = [&] {
    std::vector<double> losses = nan_filled<double>(N), lse = nan_filled<double>(N);
    return static_cast<double>(dloss) * crossentropy_forward(losses.data(), lse.data(),
                                                             logits.data(), targets.data(),
                                                             mask.data(), N, V);
  };
  std::vector<double> losses = nan_filled<double>(N), lse = nan_filled<double>(N);
  const double sum = crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(),
                                          mask.data(), N, V);
  double expected_sum = 0.0;
  for (int i = 0; i < N; ++i) {
    double z = 0.0;
    for (int j = 0; j < V; ++j) z += std::exp(logits[static_cast<size_t>(i) * V + j]);
    EXPECT_NEAR(lse[i], std::log(z), 1e-12) << "row " << i;
    const double loss = mask[i] ? std::log(z) - logits[static_cast<size_t>(i) * V + targets[i]] : 0;
    EXPECT_NEAR(losses[i], loss, 1e-12) << "row " << i;
    expected_sum += loss;
  }
  EXPECT_NEAR(sum, expected_sum, 1e-12);
  std::vector<double> dlogits = nan_filled<double>(logits.size());
  crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), mask.data(),
                        dloss, N, V);
  expect_gradients("crossentropy", {{"logits", &logits, dlogits}}, objective);
}

// The forward ops against their defining formulas, written independently (finite differences
// only prove that forward and backward agree with each other). RoPE is checked as Meta writes it:
// the pair (x[2i], x[2i+1]) as the complex number x[2i] + i x[2i+1], times e^(i p theta^(-2i/hd)).
TEST_F(OpsCpu, ForwardOpsMatchTheirFormulas) {
  const int N = 7, C = 9, V = 11, OC = 5;
  const std::vector<int32_t> tokens = {3, 1, 3, 7, 10, 0, 1};
  const std::vector<double> wte = rng_.vec(static_cast<size_t>(V) * C);
  const std::vector<double> x = rng_.vec(static_cast<size_t>(N) * C, -2.0, 2.0);
  const std::vector<double> y = rng_.vec(x.size(), -4.0, 4.0);
  const std::vector<double> w = rng_.vec(C, 0.5, 1.5);
  const std::vector<double> wm = rng_.vec(static_cast<size_t>(OC) * C);

  std::vector<double> out = nan_filled<double>(x.size()), ref(x.size());
  embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) ref[i * C + c] = wte[tokens[i] * C + c];
  expect_close("embedding out", out, ref, 0.0);

  const float eps = 1e-5f;
  std::vector<double> rstd = nan_filled<double>(N), ref_rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  for (int i = 0; i < N; ++i) {
    double ms = 0.0;
    for (int c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c] / C;
    ref_rstd[i] = 1.0 / std::sqrt(ms + eps);
    for (int c = 0; c < C; ++c) ref[i * C + c] = x[i * C + c] * ref_rstd[i] * w[c];
  }
  expect_close("rmsnorm out", out, ref, 1e-14);
  expect_close("rmsnorm rstd", rstd, ref_rstd, 1e-14);

  std::vector<double> mm = nan_filled<double>(static_cast<size_t>(N) * OC), ref_mm(mm.size());
  matmul_forward(mm.data(), x.data(), wm.data(), N, C, OC);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      double acc = 0.0;
      for (int c = 0; c < C; ++c) acc += x[i * C + c] * wm[o * C + c];
      ref_mm[i * OC + o] = acc;
    }
  expect_close("matmul out", mm, ref_mm, 1e-14);

  swiglu_forward(out.data(), y.data(), x.data(), N, C);
  for (size_t i = 0; i < x.size(); ++i) ref[i] = y[i] / (1.0 + std::exp(-y[i])) * x[i];
  expect_close("swiglu out", out, ref, 1e-14);

  residual_add(out.data(), x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = x[i] + y[i];
  expect_close("residual out", out, ref, 0.0);

  const int B = 2, Tn = 5, H = 3, hd = 8;
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 7, 300, 0, 1, 4095};
  const std::vector<double> xr = rng_.vec(static_cast<size_t>(B) * Tn * H * hd);
  std::vector<double> rot = nan_filled<double>(xr.size()), ref_rot(xr.size());
  rope_forward(rot.data(), xr.data(), pos.data(), B, Tn, H, hd, kTheta);
  for (int r = 0; r < B * Tn; ++r)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const size_t e = (static_cast<size_t>(r) * H + h) * hd + 2 * i;
        const std::complex<double> z(xr[e], xr[e + 1]);
        const std::complex<double> zr = z * std::polar(1.0, pos[r] * std::pow(10000.0, -2.0 * i / hd));
        ref_rot[e] = zr.real();
        ref_rot[e + 1] = zr.imag();
      }
  expect_close("rope out", rot, ref_rot, 1e-14);
  // Smallest case by hand: hd = 2, x = (1, 0) at position 1 rotates by 1 radian.
  const std::vector<double> unit = {1.0, 0.0};
  const std::vector<int32_t> one = {1};
  std::vector<double> r2(2);
  rope_forward(r2.data(), unit.data(), one.data(), 1, 1, 1, 2, kTheta);
  EXPECT_NEAR(r2[0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(r2[1], std::sin(1.0), 1e-15);
}

// ---- 2. float against double, odd sizes, NaN-prefilled outputs ----------------------------

TEST_F(OpsCpu, EmbeddingFloatMatchesDouble) {
  const int N = 37, C = 67, V = 131;
  std::vector<int32_t> tokens(N);
  for (int32_t& t : tokens) t = rng_.below(13);  // few ids: many repeats
  const std::vector<double> wte = rng_.vec(static_cast<size_t>(V) * C);
  const std::vector<double> dout = rng_.vec(static_cast<size_t>(N) * C);
  const std::vector<double> dwte0 = rng_.vec(wte.size());

  std::vector<double> out_d = nan_filled<double>(dout.size());
  std::vector<float> out_f = nan_filled<float>(dout.size());
  embedding_forward(out_d.data(), tokens.data(), wte.data(), N, C);
  embedding_forward(out_f.data(), tokens.data(), cast<float>(wte).data(), N, C);
  expect_close("embedding out", out_f, out_d, 0.0);  // a copy: exact

  std::vector<double> dwte_d = dwte0;
  std::vector<float> dwte_f = cast<float>(dwte0);
  embedding_backward(dwte_d.data(), dout.data(), tokens.data(), N, V, C);
  embedding_backward(dwte_f.data(), cast<float>(dout).data(), tokens.data(), N, V, C);
  expect_close("embedding dwte", dwte_f, dwte_d, fp32_tol(N));
}

TEST_F(OpsCpu, RmsnormFloatMatchesDouble) {
  const int N = 37, C = 67;
  const float eps = 1e-5f;
  const std::vector<double> x = rng_.vec(static_cast<size_t>(N) * C, -3.0, 3.0);
  const std::vector<double> w = rng_.vec(C, 0.5, 1.5);
  const std::vector<double> dout = rng_.vec(x.size());
  const std::vector<double> dw0 = rng_.vec(C);

  std::vector<double> out_d = nan_filled<double>(x.size()), rstd_d = nan_filled<double>(N);
  std::vector<float> out_f = nan_filled<float>(x.size()), rstd_f = nan_filled<float>(N);
  rmsnorm_forward(out_d.data(), rstd_d.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_forward(out_f.data(), rstd_f.data(), cast<float>(x).data(), cast<float>(w).data(), N, C,
                  eps);
  expect_close("rmsnorm out", out_f, out_d, fp32_tol(C));
  expect_close("rmsnorm rstd", rstd_f, rstd_d, fp32_tol(C));

  std::vector<double> dx_d = nan_filled<double>(x.size()), dw_d = dw0;
  std::vector<float> dx_f = nan_filled<float>(x.size()), dw_f = cast<float>(dw0);
  rmsnorm_backward(dx_d.data(), dw_d.data(), dout.data(), x.data(), w.data(), rstd_d.data(), N, C);
  rmsnorm_backward(dx_f.data(), dw_f.data(), cast<float>(dout).data(), cast<float>(x).data(),
                   cast<float>(w).data(), rstd_f.data(), N, C);
  expect_close("rmsnorm dx", dx_f, dx_d, fp32_tol(C));
  expect_close("rmsnorm dw", dw_f, dw_d, fp32_tol(N));
}

TEST_F(OpsCpu, MatmulFloatMatchesDouble) {
  const int N = 37, IC = 67, OC = 45;
  const std::vector<double> x = rng_.vec(static_cast<size_t>(N) * IC);
  const std::vector<double> w = rng_.vec(static_cast<size_t>(OC) * IC);
  const std::vector<double> dout = rng_.vec(static_cast<size_t>(N) * OC);
  const std::vector<double> dw0 = rng_.vec(w.size());

  std::vector<double> out_d = nan_filled<double>(dout.size());
  std::vector<float> out_f = nan_filled<float>(dout.size());
  matmul_forward(out_d.data(), x.data(), w.data(), N, IC, OC);
  matmul_forward(out_f.data(), cast<float>(x).data(), cast<float>(w).data(), N, IC, OC);
  expect_close("matmul out", out_f, out_d, fp32_tol(IC));

  std::vector<double> dx_d = nan_filled<double>(x.size()), dw_d = dw0;
  std::vector<float> dx_f = nan_filled<float>(x.size()), dw_f = cast<float>(dw0);
  matmul_backward(dx_d.data(), dw_d.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  matmul_backward(dx_f.data(), dw_f.data(), cast<float>(dout).data(), cast<float>(x).data(),
                  cast<float>(w).data(), N, IC, OC);
  expect_close("matmul dx", dx_f, dx_d, fp32_tol(OC));
  expect_close("matmul dw", dw_f, dw_d, fp32_tol(N));
}

TEST_F(OpsCpu, RopeFloatMatchesDouble) {
  const int B = 3, Tn = 37, H = 5, hd = 10;
  std::vector<int32_t> pos(static_cast<size_t>(B) * Tn);
  for (int32_t& p : pos) p = rng_.below(4096);  // large angles: computed in double, then rounded
  const std::vector<double> x = rng_.vec(static_cast<size_t>(B) * Tn * H * hd);
  for (const int32_t* p : std::vector<const int32_t*>{pos.data(), nullptr}) {
    SCOPED_TRACE(p ? "pos given" : "pos null");
    std::vector<double> out_d = nan_filled<double>(x.size()), dx_d = nan_filled<double>(x.size());
    std::vector<float> out_f = nan_filled<float>(x.size()), dx_f = nan_filled<float>(x.size());
    rope_forward(out_d.data(), x.data(), p, B, Tn, H, hd, kTheta);
    rope_forward(out_f.data(), cast<float>(x).data(), p, B, Tn, H, hd, kTheta);
    expect_close("rope out", out_f, out_d, fp32_tol(2));
    rope_backward(dx_d.data(), x.data(), p, B, Tn, H, hd, kTheta);
    rope_backward(dx_f.data(), cast<float>(x).data(), p, B, Tn, H, hd, kTheta);
    expect_close("rope dx", dx_f, dx_d, fp32_tol(2));
  }
}

TEST_F(OpsCpu, AttentionFloatMatchesDouble) {
  // T = 150 spans three 64-row query blocks; hd = 10 and H = 6 are not powers of two.
  const AttnShape s{2, 150, 6, 2, 10, true};
  const std::vector<int32_t> seg = make_seg_start(random_lengths(rng_, s.B, s.Tn, 60));
  const size_t nq = static_cast<size_t>(s.B) * s.Tn * s.H * s.hd;
  const size_t nkv = static_cast<size_t>(s.B) * s.Tn * s.KVH * s.hd;
  const size_t nlse = static_cast<size_t>(s.B) * s.H * s.Tn;
  const std::vector<double> q = rng_.vec(nq, -2.0, 2.0), k = rng_.vec(nkv, -2.0, 2.0),
                            v = rng_.vec(nkv), dout = rng_.vec(nq);

  std::vector<double> out_d = nan_filled<double>(nq), lse_d = nan_filled<double>(nlse);
  std::vector<float> out_f = nan_filled<float>(nq), lse_f = nan_filled<float>(nlse);
  attention_forward(out_d.data(), lse_d.data(), q.data(), k.data(), v.data(), seg.data(), s.B, s.Tn,
                    s.H, s.KVH, s.hd);
  const std::vector<float> qf = cast<float>(q), kf = cast<float>(k), vf = cast<float>(v);
  attention_forward(out_f.data(), lse_f.data(), qf.data(), kf.data(), vf.data(), seg.data(), s.B,
                    s.Tn, s.H, s.KVH, s.hd);
  expect_close("attention out", out_f, out_d, fp32_tol(s.Tn));
  expect_close("attention lse", lse_f, lse_d, fp32_tol(s.Tn));

  std::vector<double> dq_d = nan_filled<double>(nq), dk_d = nan_filled<double>(nkv),
                      dv_d = nan_filled<double>(nkv);
  std::vector<float> dq_f = nan_filled<float>(nq), dk_f = nan_filled<float>(nkv),
                     dv_f = nan_filled<float>(nkv);
  attention_backward(dq_d.data(), dk_d.data(), dv_d.data(), dout.data(), out_d.data(),
                     lse_d.data(), q.data(), k.data(), v.data(), seg.data(), s.B, s.Tn, s.H,
                     s.KVH, s.hd);
  attention_backward(dq_f.data(), dk_f.data(), dv_f.data(), cast<float>(dout).data(), out_f.data(),
                     lse_f.data(), qf.data(), kf.data(), vf.data(), seg.data(), s.B, s.Tn, s.H,
                     s.KVH, s.hd);
  // dK/dV sum over every query of every head of the group.
  const int kv_len = s.Tn * (s.H / s.KVH);
  expect_close("attention dq", dq_f, dq_d, fp32_tol(s.Tn));
  expect_close("attention dk", dk_f, dk_d, fp32_tol(kv_len));
  expect_close("attention dv", dv_f, dv_d, fp32_tol(kv_len));
}

TEST_F(OpsCpu, SwigluAndResidualFloatMatchDouble) {
  const int N = 37, F = 67;
  const size_t n = static_cast<size_t>(N) * F;
  const std::vector<double> h1 = rng_.vec(n, -6.0, 6.0), h3 = rng_.vec(n), dout = rng_.vec(n);

  std::vector<double> out_d = nan_filled<double>(n);
  std::vector<float> out_f = nan_filled<float>(n);
  swiglu_forward(out_d.data(), h1.data(), h3.data(), N, F);
  swiglu_forward(out_f.data(), cast<float>(h1).data(), cast<float>(h3).data(), N, F);
  expect_close("swiglu out", out_f, out_d, fp32_tol(1));

  std::vector<double> dh1_d = nan_filled<double>(n), dh3_d = nan_filled<double>(n);
  std::vector<float> dh1_f = nan_filled<float>(n), dh3_f = nan_filled<float>(n);
  swiglu_backward(dh1_d.data(), dh3_d.data(), dout.data(), h1.data(), h3.data(), N, F);
  swiglu_backward(dh1_f.data(), dh3_f.data(), cast<float>(dout).data(), cast<float>(h1).data(),
                  cast<float>(h3).data(), N, F);
  expect_close("swiglu dh1", dh1_f, dh1_d, fp32_tol(1));
  expect_close("swiglu dh3", dh3_f, dh3_d, fp32_tol(1));

  std::vector<double> sum_d = nan_filled<double>(n);
  std::vector<float> sum_f = nan_filled<float>(n);
  residual_add(sum_d.data(), h1.data(), h3.data(), n);
  residual_add(sum_f.data(), cast<float>(h1).data(), cast<float>(h3).data(), n);
  expect_close("residual out", sum_f, sum_d, fp32_tol(1));
}

TEST_F(OpsCpu, CrossentropyFloatMatchesDouble) {
  const int N = 37, V = 131;
  const float dloss = 1.0f / 29.0f;
  const std::vector<double> logits = rng_.vec(static_cast<size_t>(N) * V, -8.0, 8.0);
  std::vector<int32_t> targets(N);
  std::vector<uint8_t> mask(N);
  for (int i = 0; i < N; ++i) {
    targets[i] = rng_.below(V);
    mask[i] = rng_.below(4) != 0;
  }
  std::vector<double> loss_d = nan_filled<double>(N), lse_d = nan_filled<double>(N);
  std::vector<float> loss_f = nan_filled<float>(N), lse_f = nan_filled<float>(N);
  const std::vector<float> logits_f = cast<float>(logits);
  const double sum_d = crossentropy_forward(loss_d.data(), lse_d.data(), logits.data(),
                                            targets.data(), mask.data(), N, V);
  const double sum_f = crossentropy_forward(loss_f.data(), lse_f.data(), logits_f.data(),
                                            targets.data(), mask.data(), N, V);
  expect_close("crossentropy losses", loss_f, loss_d, fp32_tol(V));
  expect_close("crossentropy lse", lse_f, lse_d, fp32_tol(V));
  EXPECT_NEAR(sum_f, sum_d, fp32_tol(V * N) * std::abs(sum_d));

  std::vector<double> dl_d = nan_filled<double>(logits.size());
  std::vector<float> dl_f = nan_filled<float>(logits.size());
  crossentropy_backward(dl_d.data(), logits.data(), lse_d.data(), targets.data(), mask.data(),
                        dloss, N, V);
  crossentropy_backward(dl_f.data(), logits_f.data(), lse_f.data(), targets.data(), mask.data(),
                        dloss, N, V);
  expect_close("crossentropy dlogits", dl_f, dl_d, fp32_tol(V));
}

// ---- 3. attention against the naive reference; packed rows equal separate examples -------

TEST_F(OpsCpu, AttentionMatchesNaiveReference) {
  const std::vector<AttnShape> shapes = {
      {2, 150, 6, 2, 10, true}, {1, 130, 4, 4, 8, false}, {3, 17, 8, 1, 5, true}};
  for (const AttnShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.Tn << " H=" << s.H
                                    << " KVH=" << s.KVH << " hd=" << s.hd);
    const std::vector<int32_t> seg = make_seg_start(random_lengths(rng_, s.B, s.Tn, 50));
    const int32_t* seg_ptr = s.segments ? seg.data() : nullptr;
    const size_t nq = static_cast<size_t>(s.B) * s.Tn * s.H * s.hd;
    const size_t nkv = static_cast<size_t>(s.B) * s.Tn * s.KVH * s.hd;
    const std::vector<double> q = rng_.vec(nq, -2.0, 2.0), k = rng_.vec(nkv, -2.0, 2.0),
                              v = rng_.vec(nkv), dout = rng_.vec(nq);
    std::vector<double> ref_out, ref_lse, ref_dq, ref_dk, ref_dv;
    naive_attention_forward(ref_out, ref_lse, q, k, v, seg_ptr, s);
    naive_attention_backward(ref_dq, ref_dk, ref_dv, dout, q, k, v, seg_ptr, s);

    std::vector<double> out = nan_filled<double>(nq), lse = nan_filled<double>(ref_lse.size());
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg_ptr, s.B, s.Tn,
                      s.H, s.KVH, s.hd);
    expect_close("attention out", out, ref_out, 1e-12);
    expect_close("attention lse", lse, ref_lse, 1e-12);
    std::vector<double> dq = nan_filled<double>(nq), dk = nan_filled<double>(nkv),
                        dv = nan_filled<double>(nkv);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), seg_ptr, s.B, s.Tn, s.H, s.KVH, s.hd);
    expect_close("attention dq", dq, ref_dq, 1e-11);
    expect_close("attention dk", dk, ref_dk, 1e-11);
    expect_close("attention dv", dv, ref_dv, 1e-11);
  }
}

// Packing several examples into one row (positions restart, seg_start masks earlier examples)
// must give each example exactly what it gets alone: rope + attention forward and backward.
TEST_F(OpsCpu, PackedRowEqualsSeparateExamples) {
  const int H = 4, KVH = 2, hd = 8;
  const std::vector<int> lengths = {40, 70, 1, 39};  // crosses the 64-row blocks
  int Tn = 0;
  for (int len : lengths) Tn += len;
  const std::vector<int32_t> seg = make_seg_start({lengths}), pos = make_positions({lengths});
  const size_t q_row = static_cast<size_t>(H) * hd, kv_row = static_cast<size_t>(KVH) * hd;
  const std::vector<double> q = rng_.vec(Tn * q_row, -2.0, 2.0),
                            k = rng_.vec(Tn * kv_row, -2.0, 2.0), v = rng_.vec(Tn * kv_row),
                            dout = rng_.vec(Tn * q_row);

  // Forward: rope q, k with pos, attention with seg_start; backward through both.
  struct Result {
    std::vector<double> out, dq, dk, dv;
  };
  auto run = [&](int T, size_t first, const int32_t* p, const int32_t* sg) {
    auto slice = [&](const std::vector<double>& x, size_t row) {
      return std::vector<double>(x.begin() + first * row, x.begin() + (first + T) * row);
    };
    std::vector<double> qr = slice(q, q_row), kr = slice(k, kv_row), vr = slice(v, kv_row),
                        dor = slice(dout, q_row);
    rope_forward(qr.data(), qr.data(), p, 1, T, H, hd, kTheta);
    rope_forward(kr.data(), kr.data(), p, 1, T, KVH, hd, kTheta);
    Result r;
    r.out = nan_filled<double>(T * q_row);
    std::vector<double> lse = nan_filled<double>(static_cast<size_t>(H) * T);
    attention_forward(r.out.data(), lse.data(), qr.data(), kr.data(), vr.data(), sg, 1, T, H, KVH,
                      hd);
    r.dq = nan_filled<double>(T * q_row);
    r.dk = nan_filled<double>(T * kv_row);
    r.dv = nan_filled<double>(T * kv_row);
    attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dor.data(), r.out.data(), lse.data(),
                       qr.data(), kr.data(), vr.data(), sg, 1, T, H, KVH, hd);
    rope_backward(r.dq.data(), r.dq.data(), p, 1, T, H, hd, kTheta);
    rope_backward(r.dk.data(), r.dk.data(), p, 1, T, KVH, hd, kTheta);
    return r;
  };
  const Result packed = run(Tn, 0, pos.data(), seg.data());
  size_t first = 0;
  for (int len : lengths) {
    SCOPED_TRACE(::testing::Message() << "example at " << first << " of length " << len);
    const Result alone = run(len, first, nullptr, nullptr);
    auto part = [&](const std::vector<double>& x, size_t row) {
      return std::vector<double>(x.begin() + first * row, x.begin() + (first + len) * row);
    };
    // Inputs are O(1); a one-token example has dq = dk = 0 exactly in math, rounding noise here.
    expect_close("out", part(packed.out, q_row), alone.out, 1e-12, 1.0);
    expect_close("dq", part(packed.dq, q_row), alone.dq, 1e-12, 1.0);
    expect_close("dk", part(packed.dk, kv_row), alone.dk, 1e-12, 1.0);
    expect_close("dv", part(packed.dv, kv_row), alone.dv, 1e-12, 1.0);
    first += len;
  }
}

// ---- 4. optimizer ops, masking, aliasing, accumulation, determinism ----------------------

TEST_F(OpsCpu, AdamwMatchesHandComputedStep) {
  // Step 1 from m = v = 0 with g = 0.5, p = 1, lr = 0.1, b1 = 0.9, b2 = 0.95, wd = 0.1:
  //   m = 0.1 * 0.5 = 0.05, v = 0.05 * 0.25 = 0.0125, m_hat = 0.05 / 0.1 = 0.5,
  //   v_hat = 0.0125 / 0.05 = 0.25, p = 1 - 0.1 * (0.5 / (0.5 + eps) + 0.1 * 1) = 0.89.
  // Element 1 has g = 0: m, v stay 0 and only the decay acts: p = -2 - 0.1 * 0.1 * (-2) = -1.98.
  std::vector<float> p = {1.0f, -2.0f}, m = {0.0f, 0.0f}, v = {0.0f, 0.0f};
  const std::vector<float> g = {0.5f, 0.0f};
  adamw_update(p.data(), m.data(), v.data(), g.data(), 2, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  // fp32 relative tolerance: (1 - b1) and (1 - b2) are themselves rounded to float.
  EXPECT_NEAR(m[0], 0.05, 0.05 * 1e-6);
  EXPECT_NEAR(v[0], 0.0125, 0.0125 * 1e-6);
  EXPECT_NEAR(p[0], 0.89, 0.89 * 1e-6);
  EXPECT_EQ(m[1], 0.0f);
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_NEAR(p[1], -1.98, 1.98 * 1e-6);

  // Further steps on random state against the header's formula in double.
  const size_t n = 1001;
  const std::vector<double> p0 = rng_.vec(n), g0 = rng_.vec(n), m0 = rng_.vec(n, -0.1, 0.1),
                            v0 = rng_.vec(n, 0.0, 0.01);
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const int t = 7;
  std::vector<float> pf = cast<float>(p0), mf = cast<float>(m0), vf = cast<float>(v0);
  adamw_update(pf.data(), mf.data(), vf.data(), cast<float>(g0).data(), n, lr, b1, b2, eps, wd, t);
  std::vector<double> p_ref(n), m_ref(n), v_ref(n);
  for (size_t i = 0; i < n; ++i) {
    m_ref[i] = b1 * m0[i] + (1.0 - b1) * g0[i];
    v_ref[i] = b2 * v0[i] + (1.0 - b2) * g0[i] * g0[i];
    const double m_hat = m_ref[i] / (1.0 - std::pow(b1, t));
    const double v_hat = v_ref[i] / (1.0 - std::pow(b2, t));
    p_ref[i] = p0[i] - lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p0[i]);
  }
  expect_close("adamw m", mf, m_ref, 1e-6);
  expect_close("adamw v", vf, v_ref, 1e-6);
  expect_close("adamw param", pf, p_ref, 1e-6);
}

TEST_F(OpsCpu, SumSquaresAndScale) {
  const size_t n = 3 * 16384 + 5;  // several chunks and a ragged end
  const std::vector<double> xd = rng_.vec(n);
  std::vector<float> x = cast<float>(xd);
  double ref = 0.0;
  for (double e : xd) ref += e * e;
  EXPECT_NEAR(sum_squares(x.data(), n), ref, 1e-12 * ref);
  EXPECT_EQ(sum_squares(x.data(), 0), 0.0);

  const float s = 0.37f;
  std::vector<float> y = x;
  scale_inplace(y.data(), s, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * s) << "element " << i;
}

TEST_F(OpsCpu, CrossentropyFullyMaskedGivesZeroLossAndGradient) {
  const int N = 5, V = 13;
  const std::vector<double> logits = rng_.vec(static_cast<size_t>(N) * V, -3.0, 3.0);
  const std::vector<int32_t> targets = {1, -1, 12, 99, 0};  // masked rows may hold padding ids
  const std::vector<uint8_t> mask(N, 0);
  std::vector<float> losses = nan_filled<float>(N), lse = nan_filled<float>(N);
  const std::vector<float> lf = cast<float>(logits);
  const double sum = crossentropy_forward(losses.data(), lse.data(), lf.data(), targets.data(),
                                          mask.data(), N, V);
  EXPECT_EQ(sum, 0.0);
  for (int i = 0; i < N; ++i) {
    EXPECT_EQ(losses[i], 0.0f) << "row " << i;
    EXPECT_TRUE(std::isfinite(lse[i])) << "row " << i;
  }
  std::vector<float> dlogits = nan_filled<float>(logits.size());
  crossentropy_backward(dlogits.data(), lf.data(), lse.data(), targets.data(), mask.data(), 1.0f,
                        N, V);
  for (size_t i = 0; i < dlogits.size(); ++i) ASSERT_EQ(dlogits[i], 0.0f) << "element " << i;

  // A loss row whose target lies outside the vocabulary is an error, not a silent read.
  std::vector<uint8_t> one_row(N, 0);
  one_row[3] = 1;
  EXPECT_THROW(crossentropy_forward(losses.data(), lse.data(), lf.data(), targets.data(),
                                    one_row.data(), N, V),
               lt::Error);
}

// A loss mask value is the token's weight (prepare --decision-weight): a row of weight w has w
// times the loss of weight 1 and the gradient of weight 1 at w times dloss, bit for bit in fp32.
TEST_F(OpsCpu, CrossentropyMaskIsEachRowsWeight) {
  const int N = 6, V = 17;
  const std::vector<float> lf = cast<float>(rng_.vec(static_cast<size_t>(N) * V, -3.0, 3.0));
  std::vector<int32_t> targets(N);
  for (int32_t& t : targets) t = rng_.below(V);
  const std::vector<uint8_t> weights = {1, 5, 0, 3, 255, 1}, ones = {1, 1, 1, 1, 1, 1};
  std::vector<float> lw(N), l1(N), lse(N);
  const double sum_w = crossentropy_forward(lw.data(), lse.data(), lf.data(), targets.data(), weights.data(), N, V);
  crossentropy_forward(l1.data(), lse.data(), lf.data(), targets.data(), ones.data(), N, V);
  double expected = 0;
  for (int i = 0; i < N; ++i) {
    EXPECT_FLOAT_EQ(lw[i], weights[size_t(i)] * l1[i]) << "row " << i;
    expected += double(weights[size_t(i)]) * l1[i];
  }
  EXPECT_NEAR(sum_w, expected, 1e-5 * expected);
  const float dloss = 1.0f / 37;
  std::vector<float> dw(lf.size()), d1(lf.size());
  crossentropy_backward(dw.data(), lf.data(), lse.data(), targets.data(), weights.data(), dloss, N, V);
  for (int i = 0; i < N; ++i) {
    const uint8_t one = 1;
    crossentropy_backward(d1.data() + size_t(i) * V, lf.data() + size_t(i) * V, lse.data() + i, targets.data() + i,
                          &one, dloss * float(weights[size_t(i)]), 1, V);
  }
  for (size_t e = 0; e < dw.size(); ++e) ASSERT_EQ(dw[e], d1[e]) << "element " << e << " (row " << e / V << ")";
}

TEST_F(OpsCpu, InPlaceAliasingGivesSameResults) {
  const int N = 9, V = 37;
  const std::vector<float> logits = cast<float>(rng_.vec(static_cast<size_t>(N) * V, -4.0, 4.0));
  std::vector<int32_t> targets(N);
  for (int32_t& t : targets) t = rng_.below(V);
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 1, 1, 0, 1, 1};
  std::vector<float> losses(N), lse(N);
  crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), mask.data(), N, V);
  std::vector<float> dlogits(logits.size());
  crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), mask.data(),
                        0.125f, N, V);
  std::vector<float> in_place = logits;
  crossentropy_backward(in_place.data(), in_place.data(), lse.data(), targets.data(), mask.data(),
                        0.125f, N, V);
  EXPECT_EQ(in_place, dlogits) << "crossentropy_backward with dlogits == logits";

  const int B = 2, Tn = 11, H = 3, hd = 6;
  const std::vector<float> x = cast<float>(rng_.vec(static_cast<size_t>(B) * Tn * H * hd));
  std::vector<float> out(x.size()), dx(x.size());
  rope_forward(out.data(), x.data(), nullptr, B, Tn, H, hd, kTheta);
  rope_backward(dx.data(), x.data(), nullptr, B, Tn, H, hd, kTheta);
  std::vector<float> y = x;
  rope_forward(y.data(), y.data(), nullptr, B, Tn, H, hd, kTheta);
  EXPECT_EQ(y, out) << "rope_forward with out == x";
  y = x;
  rope_backward(y.data(), y.data(), nullptr, B, Tn, H, hd, kTheta);
  EXPECT_EQ(y, dx) << "rope_backward with dx == dout";
  // pos == t for every row must be the same as a null pos.
  std::vector<int32_t> pos(static_cast<size_t>(B) * Tn);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i % Tn);
  std::vector<float> out_pos(x.size());
  rope_forward(out_pos.data(), x.data(), pos.data(), B, Tn, H, hd, kTheta);
  EXPECT_EQ(out_pos, out) << "rope_forward with pos = t";

  std::vector<float> a = x, b = out, sum(x.size());
  residual_add(sum.data(), a.data(), b.data(), a.size());
  residual_add(a.data(), a.data(), b.data(), a.size());
  EXPECT_EQ(a, sum) << "residual_add with out == a";
}

// `+=` outputs (parameter gradients) must add onto what is there: g from zero, then c + g.
TEST_F(OpsCpu, ParameterGradientsAccumulate) {
  const int N = 13, C = 21, V = 17, OC = 11;
  std::vector<int32_t> tokens(N);
  for (int32_t& t : tokens) t = rng_.below(V);
  const std::vector<float> dout = cast<float>(rng_.vec(static_cast<size_t>(N) * C));
  const std::vector<float> x = cast<float>(rng_.vec(static_cast<size_t>(N) * C));
  const std::vector<float> w = cast<float>(rng_.vec(C, 0.5, 1.5));
  const std::vector<float> wm = cast<float>(rng_.vec(static_cast<size_t>(OC) * C));
  const std::vector<float> dmm = cast<float>(rng_.vec(static_cast<size_t>(N) * OC));
  std::vector<float> out(x.size()), rstd(N), dx(x.size());
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);

  auto check = [&](const char* what, size_t n, const std::function<void(float*)>& backward) {
    const std::vector<double> c = rng_.vec(n, -10.0, 10.0);
    std::vector<float> from_zero(n, 0.0f), from_c = cast<float>(c);
    backward(from_zero.data());
    backward(from_c.data());
    std::vector<double> expected(n);
    double max_g = 0.0;
    for (size_t i = 0; i < n; ++i) {
      expected[i] = c[i] + from_zero[i];
      max_g = std::max(max_g, std::abs(static_cast<double>(from_zero[i])));
    }
    EXPECT_GT(max_g, 1e-3) << what << ": gradient is ~0, the check cannot fail";
    expect_close(what, from_c, expected, 1e-6);
  };
  check("embedding dwte", static_cast<size_t>(V) * C, [&](float* dwte) {
    embedding_backward(dwte, dout.data(), tokens.data(), N, V, C);
  });
  check("rmsnorm dw", C, [&](float* dw) {
    rmsnorm_backward(dx.data(), dw, dout.data(), x.data(), w.data(), rstd.data(), N, C);
  });
  check("matmul dw", static_cast<size_t>(OC) * C, [&](float* dw) {
    matmul_backward(dx.data(), dw, dmm.data(), x.data(), wm.data(), N, C, OC);
  });
}

// Results must not depend on the run or on the number of OpenMP threads: every reduction has a
// fixed order (column-parallel dw/dwte, fixed-size chunks, per-task attention).
TEST_F(OpsCpu, ResultsIndependentOfThreadCount) {
  ThreadCountGuard guard;
  const AttnShape s{2, 97, 4, 2, 12, true};
  const std::vector<int32_t> seg = make_seg_start(random_lengths(rng_, s.B, s.Tn, 40));
  const size_t nq = static_cast<size_t>(s.B) * s.Tn * s.H * s.hd;
  const size_t nkv = static_cast<size_t>(s.B) * s.Tn * s.KVH * s.hd;
  const std::vector<float> q = cast<float>(rng_.vec(nq)), k = cast<float>(rng_.vec(nkv)),
                           v = cast<float>(rng_.vec(nkv)), dout = cast<float>(rng_.vec(nq));
  const int N = 300, C = 70, V = 50;
  std::vector<int32_t> tokens(N);
  for (int32_t& t : tokens) t = rng_.below(V);
  const std::vector<float> x = cast<float>(rng_.vec(static_cast<size_t>(N) * C));
  const std::vector<float> w = cast<float>(rng_.vec(C, 0.5, 1.5));
  const std::vector<float> g = cast<float>(rng_.vec(static_cast<size_t>(N) * C));
  const std::vector<float> big = cast<float>(rng_.vec(100003));
  std::vector<uint8_t> mask(N);
  for (uint8_t& m : mask) m = rng_.below(3) != 0;

  struct Outputs {
    std::vector<float> att_out, lse, dq, dk, dv, dwte, dx, dw;
    double loss, ss;
  };
  auto run_all = [&] {
    Outputs o;
    o.att_out.assign(nq, 0.0f);
    o.lse.assign(static_cast<size_t>(s.B) * s.H * s.Tn, 0.0f);
    attention_forward(o.att_out.data(), o.lse.data(), q.data(), k.data(), v.data(), seg.data(),
                      s.B, s.Tn, s.H, s.KVH, s.hd);
    o.dq.assign(nq, 0.0f);
    o.dk.assign(nkv, 0.0f);
    o.dv.assign(nkv, 0.0f);
    attention_backward(o.dq.data(), o.dk.data(), o.dv.data(), dout.data(), o.att_out.data(),
                       o.lse.data(), q.data(), k.data(), v.data(), seg.data(), s.B, s.Tn, s.H,
                       s.KVH, s.hd);
    o.dwte.assign(static_cast<size_t>(V) * C, 0.0f);
    embedding_backward(o.dwte.data(), g.data(), tokens.data(), N, V, C);
    std::vector<float> out(x.size()), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    o.dx.assign(x.size(), 0.0f);
    o.dw.assign(C, 0.0f);
    rmsnorm_backward(o.dx.data(), o.dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
    std::vector<float> losses(N), lse(N);
    std::vector<int32_t> targets(tokens.begin(), tokens.end());
    o.loss = crossentropy_forward(losses.data(), lse.data(), x.data(), targets.data(), mask.data(),
                                  N, C);
    o.ss = sum_squares(big.data(), big.size());
    return o;
  };
  omp_set_num_threads(2);
  const Outputs ref = run_all();
  for (int threads : {2, 1, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    omp_set_num_threads(threads);
    const Outputs o = run_all();
    EXPECT_EQ(o.att_out, ref.att_out);
    EXPECT_EQ(o.lse, ref.lse);
    EXPECT_EQ(o.dq, ref.dq);
    EXPECT_EQ(o.dk, ref.dk);
    EXPECT_EQ(o.dv, ref.dv);
    EXPECT_EQ(o.dwte, ref.dwte);
    EXPECT_EQ(o.dx, ref.dx);
    EXPECT_EQ(o.dw, ref.dw);
    EXPECT_EQ(o.loss, ref.loss);
    EXPECT_EQ(o.ss, ref.ss);
  }
}

TEST_F(OpsCpu, EmbeddingRejectsTokensOutsideVocabulary) {
  const int N = 3, V = 5, C = 4;
  const std::vector<int32_t> tokens = {0, 5, 1};
  std::vector<float> dwte(static_cast<size_t>(V) * C, 0.0f), dout(static_cast<size_t>(N) * C, 1.0f);
  EXPECT_THROW(embedding_backward(dwte.data(), dout.data(), tokens.data(), N, V, C), lt::Error);
}

}  // namespace
}  // namespace lt::cpu
