// kernels/optimizer.cu under the CUDA simulator, against the CPU backend (lt::cpu::adamw_update,
// sum_squares, scale_inplace) on random fp32 inputs. Sizes are not multiples of the block size
// (256); every buffer has kPad sentinel elements past its end that must stay untouched.
// Tolerances: AdamW is a fixed sequence of IEEE fp32 operations written in the CPU op's order, so
// the only admissible difference is FMA contraction (nvcc on the device; not the x86-64 g++ build
// of the simulator), which changes a step by at most a few ulps of its terms: relative 1e-6
// (~8 ulp) on the master weights and moments. The bf16 copy must equal bf16(master) exactly.
// The sum of squares is accumulated in double from fp32 squares that are exact in double, so any
// summation order agrees with the reference to ~n * 2^-53 relative: 1e-6 is generous.
// The bf16 gradient shard's kernels (ZeRO 2/3 with --grad-reduce-dtype bf16) are held to the bits
// of the CPU's lt::GradShard, whose rounding and hash they share.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernel_cases.h"
#include "llamatrain/grad_shard.h"
#include "llamatrain/mix64.h"
#include "llamatrain/ops_cpu.h"
#include "optimizer.cuh"

namespace {

constexpr size_t kPad = 8;
constexpr float kSentinel = -12288.0f;  // exactly representable in bf16

std::vector<float> padded(size_t n) { return std::vector<float>(n + kPad, kSentinel); }

int touched_tail(const std::vector<float>& v, size_t n) {
  int bad = 0;
  for (size_t k = n; k < v.size(); ++k) bad += v[k] != kSentinel;
  return bad;
}
int touched_tail(const std::vector<__nv_bfloat16>& v, size_t n) {
  int bad = 0;
  for (size_t k = n; k < v.size(); ++k) bad += __bfloat162float(v[k]) != kSentinel;
  return bad;
}

uint16_t bits(__nv_bfloat16 h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

// Worst relative error |got - ref| / |ref| (absolute where ref == 0) and the bit-mismatch count.
struct RelReport {
  double worst = 0.0;
  size_t at = 0, mismatches = 0;
  void add(size_t i, float got, float ref) {
    if (std::memcmp(&got, &ref, sizeof got) != 0) ++mismatches;
    const double e = ref != 0.f ? std::fabs(static_cast<double>(got) - ref) / std::fabs(static_cast<double>(ref))
                                : std::fabs(static_cast<double>(got));
    if (!(e <= worst)) worst = e, at = i;  // NaN counts as worst
  }
};

TEST(OptimizerSim, AdamwMatchesCpuOverSteps) {
  const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  for (const float wd : {0.0f, 0.1f}) {
    for (const lt::kernelcases::Elements& c : lt::kernelcases::kAdamw) {
      if (c.large) continue;  // the device program's (kernel_cases.h)
      const size_t n = c.n;
      const unsigned seed = lt::kernelcases::adamw_seed(n, wd > 0);
      std::printf("[adamw] n=%zu wd=%g seed=%u\n", n, wd, seed);
      std::mt19937 rng(seed);
      std::normal_distribution<float> pdist(0.f, 0.5f), gdist(0.f, 1e-2f);
      std::vector<float> param = padded(n), m = padded(n), v = padded(n), grad = padded(n);
      std::vector<__nv_bfloat16> pbf(n + kPad, __float2bfloat16(kSentinel));
      for (size_t i = 0; i < n; ++i) param[i] = pdist(rng), m[i] = 0.f, v[i] = 0.f;
      std::vector<float> rparam(param.begin(), param.begin() + n), rm(n, 0.f), rv(n, 0.f);
      RelReport pe, me, ve;
      size_t bf_mismatch = 0;
      for (int t = 1; t <= 5; ++t) {
        for (size_t i = 0; i < n; ++i) {
          grad[i] = gdist(rng);
          if (i % 97 == 5) grad[i] = 0.f;  // a zero gradient (v_hat may be 0 at t = 1)
        }
        lt::cuda::AdamwParams p;
        p.param = param.data(), p.m = m.data(), p.v = v.data(), p.grad = grad.data(), p.param_bf16 = pbf.data();
        p.n = n, p.lr = lr, p.beta1 = beta1, p.beta2 = beta2, p.eps = eps, p.weight_decay = wd, p.t = t;
        lt::cuda::adamw_update_cuda(p, nullptr);
        lt::cpu::adamw_update(rparam.data(), rm.data(), rv.data(), grad.data(), n, lr, beta1, beta2, eps, wd, t);
        pe = RelReport(), me = RelReport(), ve = RelReport(), bf_mismatch = 0;
        for (size_t i = 0; i < n; ++i) {
          pe.add(i, param[i], rparam[i]);
          me.add(i, m[i], rm[i]);
          ve.add(i, v[i], rv[i]);
          bf_mismatch += bits(pbf[i]) != bits(__float2bfloat16(param[i]));
        }
        EXPECT_LE(pe.worst, 1e-6) << "param n=" << n << " t=" << t << " at " << pe.at;
        EXPECT_LE(me.worst, 1e-6) << "m n=" << n << " t=" << t << " at " << me.at;
        EXPECT_LE(ve.worst, 1e-6) << "v n=" << n << " t=" << t << " at " << ve.at;
        EXPECT_EQ(bf_mismatch, 0u) << "bf16 copy differs from bf16(master), n=" << n << " t=" << t;
      }
      std::printf("  after t=5: param worst rel %.3e (%zu bit mismatches), m %.3e (%zu), v %.3e (%zu), "
                  "bf16 copy mismatches %zu\n",
                  pe.worst, pe.mismatches, me.worst, me.mismatches, ve.worst, ve.mismatches, bf_mismatch);
      EXPECT_EQ(touched_tail(param, n) + touched_tail(m, n) + touched_tail(v, n) + touched_tail(grad, n), 0);
      EXPECT_EQ(touched_tail(pbf, n), 0);
    }
  }
}

// param_bf16 = nullptr skips the copy and changes nothing else.
TEST(OptimizerSim, AdamwWithoutBf16Copy) {
  const size_t n = 1000;
  std::mt19937 rng(42);
  std::printf("[adamw no bf16] n=%zu seed=42\n", n);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> param = padded(n), m = padded(n), v = padded(n), grad = padded(n);
  for (size_t i = 0; i < n; ++i) param[i] = dist(rng), m[i] = 0.1f * dist(rng), v[i] = std::fabs(dist(rng)), grad[i] = dist(rng);
  std::vector<float> rparam(param.begin(), param.begin() + n), rm(m.begin(), m.begin() + n), rv(v.begin(), v.begin() + n);
  lt::cuda::AdamwParams p;
  p.param = param.data(), p.m = m.data(), p.v = v.data(), p.grad = grad.data();
  p.n = n, p.lr = 1e-2f, p.weight_decay = 0.01f, p.t = 3;
  lt::cuda::adamw_update_cuda(p, nullptr);
  lt::cpu::adamw_update(rparam.data(), rm.data(), rv.data(), grad.data(), n, p.lr, p.beta1, p.beta2, p.eps,
                        p.weight_decay, p.t);
  RelReport pe;
  for (size_t i = 0; i < n; ++i) pe.add(i, param[i], rparam[i]);
  std::printf("  param worst rel %.3e (%zu bit mismatches)\n", pe.worst, pe.mismatches);
  EXPECT_LE(pe.worst, 1e-6);
  EXPECT_EQ(touched_tail(param, n) + touched_tail(m, n) + touched_tail(v, n), 0);
}

TEST(OptimizerSim, SumSquaresMatchesDoubleAndIsDeterministic) {
  for (const lt::kernelcases::Elements& c : lt::kernelcases::kSumSquares) {
    if (c.large) continue;  // the device program's (kernel_cases.h)
    const size_t n = c.n;
    const unsigned seed = lt::kernelcases::sum_squares_seed(n);
    std::printf("[sum_squares] n=%zu seed=%u\n", n, seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 3.f);
    std::vector<float> x = padded(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
    const size_t ns = lt::cuda::sum_squares_scratch_doubles(n);
    ASSERT_GE(ns, 1u);
    std::vector<double> scratch(ns + kPad, -1.0);
    double out[2] = {-1.0, -7.0}, out2[2] = {-2.0, -7.0};
    lt::cuda::sum_squares_cuda(out, x.data(), n, scratch.data(), nullptr);
    lt::cuda::sum_squares_cuda(out2, x.data(), n, scratch.data(), nullptr);
    double ref = 0.0;
    for (size_t i = 0; i < n; ++i) ref += static_cast<double>(x[i]) * x[i];
    const double cpu = lt::cpu::sum_squares(x.data(), n);
    const double rel = ref != 0.0 ? std::fabs(out[0] - ref) / ref : std::fabs(out[0]);
    const double rel_cpu = cpu != 0.0 ? std::fabs(out[0] - cpu) / cpu : std::fabs(out[0]);
    std::printf("  kernel %.17g ref %.17g: rel %.3e (vs cpu::sum_squares %.3e), %zu partials\n", out[0], ref, rel,
                rel_cpu, ns);
    EXPECT_LE(rel, 1e-6);
    EXPECT_LE(rel_cpu, 1e-6);
    EXPECT_EQ(std::memcmp(&out[0], &out2[0], sizeof(double)), 0) << "two runs differ, n=" << n;
    EXPECT_EQ(out[1], -7.0);
    EXPECT_EQ(out2[1], -7.0);
    for (size_t k = ns; k < scratch.size(); ++k) EXPECT_EQ(scratch[k], -1.0) << "scratch written past its size";
    EXPECT_EQ(touched_tail(x, n), 0);
  }
}

TEST(OptimizerSim, ScaleInplaceMatchesCpu) {
  for (const lt::kernelcases::Elements& c : lt::kernelcases::kScale) {
    const size_t n = c.n;
    const unsigned seed = lt::kernelcases::scale_seed(n);
    std::printf("[scale] n=%zu seed=%u\n", n, seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 2.f);
    std::vector<float> x = padded(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
    std::vector<float> ref(x.begin(), x.begin() + n);
    const float s = 0.37f;
    lt::cuda::scale_inplace_cuda(x.data(), s, n, nullptr);
    lt::cpu::scale_inplace(ref.data(), s, n);
    EXPECT_EQ(std::memcmp(x.data(), ref.data(), n * sizeof(float)), 0);
    EXPECT_EQ(touched_tail(x, n), 0);
  }
}

TEST(OptimizerSim, CastRoundsToNearestEven) {
  for (const lt::kernelcases::Elements& c : lt::kernelcases::kCast) {
    const size_t n = c.n;
    const unsigned seed = lt::kernelcases::cast_seed(n);
    std::printf("[cast] n=%zu seed=%u\n", n, seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 5.f);
    std::vector<float> x = padded(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
    // Exact ties (1 + 2^-8 rounds down to 1, 1 + 3 * 2^-8 up), specials, the largest finite float.
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0.0f, -0.0f,
                             std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
    for (size_t k = 0; k < sizeof special / sizeof special[0] && k < n; ++k) x[k] = special[k];
    std::vector<__nv_bfloat16> out(n + kPad, __float2bfloat16(kSentinel));
    lt::cuda::cast_f32_to_bf16_cuda(out.data(), x.data(), n, nullptr);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += bits(out[i]) != bits(__float2bfloat16(x[i]));
    EXPECT_EQ(bad, 0u);
    if (n > 1) {
      EXPECT_EQ(__bfloat162float(out[0]), 1.0f);
      EXPECT_EQ(__bfloat162float(out[1]), 1.0f + 0x1p-6f);
    }
    EXPECT_EQ(touched_tail(out, n), 0);
  }
}

// A bf16 gradient shard on the device takes the bits of the CPU's GradShard: the same adds (the
// whole shard and a window of it, several times, so sums grow and the stochastic rounding goes
// both ways), the same scale; its sum of squares within 1e-12 of GradShard's (double sums of exact
// squares in another order); AdamW reading it gives the bits of AdamW reading its fp32 values.
TEST(OptimizerSim, Bf16ShardKernelsMatchGradShard) {
  const size_t n = 4099;
  const unsigned seed = 1202;
  std::printf("[bf16 shard] n=%zu seed=%u\n", n, seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1e-2f);
  lt::GradShard cpu;
  cpu.assign(n, lt::DType::kBF16);
  std::vector<__nv_bfloat16> dev(n + kPad, __float2bfloat16(kSentinel));
  for (size_t i = 0; i < n; ++i) dev[i] = __float2bfloat16(0.f);
  uint64_t adds = 0;
  for (int round = 0; round < 6; ++round) {
    const size_t at = round % 2 ? 100 : 0, len = round % 2 ? 2000 : n;
    std::vector<float> x(len);
    for (float& v : x) v = dist(rng);
    cpu.add(at, x.data(), len);
    lt::cuda::add_stochastic_bf16_cuda(dev.data() + at, x.data(), len, lt::mix64(++adds), at,
                                       nullptr);
  }
  auto mismatches = [&] {
    const std::vector<float> ref = cpu.to_f32();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += __bfloat162float(dev[i]) != ref[i];
    return bad;
  };
  EXPECT_EQ(mismatches(), 0u) << "after the adds";
  std::printf("  %zu of %zu elements equal GradShard's bits after 6 adds\n", n - mismatches(), n);
  const size_t ns = lt::cuda::sum_squares_scratch_doubles(n);
  std::vector<double> scratch(ns);
  double sq = -1;
  lt::cuda::sum_squares_cuda(&sq, dev.data(), n, scratch.data(), nullptr);
  const double ref_sq = cpu.sum_squares(0, n);
  std::printf("  sum of squares %.17g, GradShard %.17g\n", sq, ref_sq);
  EXPECT_NEAR(sq, ref_sq, 1e-12 * ref_sq);
  lt::cuda::scale_inplace_cuda(dev.data(), 0.37f, n, nullptr);
  cpu.scale(0.37f);
  EXPECT_EQ(mismatches(), 0u) << "after the scale";
  EXPECT_EQ(touched_tail(dev, n), 0);
  // AdamW on the bf16 gradient against AdamW on its fp32 values.
  const std::vector<float> g32 = cpu.to_f32();
  std::vector<float> p1(n), m1(n, 0.f), v1(n, 0.f);
  for (float& v : p1) v = dist(rng);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  lt::cuda::AdamwParams a;
  a.param = p1.data(), a.m = m1.data(), a.v = v1.data(), a.grad_bf16 = dev.data(), a.n = n, a.lr = 1e-3f, a.t = 2;
  lt::cuda::adamw_update_cuda(a, nullptr);
  a.param = p2.data(), a.m = m2.data(), a.v = v2.data(), a.grad_bf16 = nullptr, a.grad = g32.data();
  lt::cuda::adamw_update_cuda(a, nullptr);
  EXPECT_EQ(std::memcmp(p1.data(), p2.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), n * sizeof(float)), 0);
}

}  // namespace
