// kernels/crossentropy.cu under the CUDA simulator, against the CPU backend
// (lt::cpu::crossentropy_*) in fp32 and fp64. Logits are bf16; every reference sees the same
// bf16 values. Low-precision rule (STYLE.md): the kernel's worst error against fp64 is at most 2x
// that of the naive bf16 computation (the fp32 CPU op on the bf16 logits, result rounded to bf16).
// The fp32 outputs (losses, lse, loss sum) also get a tighter fp32 bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "crossentropy.cuh"
#include "kernel_cases.h"
#include "llamatrain/ops_cpu.h"
#include "sim_test_util.h"

namespace {

using lt::simtest::bf;
using lt::simtest::Bf16Matrix;
using lt::simtest::describe;
using lt::simtest::ErrorReport;
using lt::simtest::kPad;
using lt::simtest::kSentinel;

constexpr float kDloss = 1.0f / 37.0f;

using Shape = lt::kernelcases::Crossentropy;

double ratio(const ErrorReport& k, const ErrorReport& n) { return n.worst > 0 ? k.worst / n.worst : 0.0; }

// Inputs of one case: bf16 logits, targets (masked rows get -1: the kernel must not read them),
// mask or none: every third row masked out, row 0 always in with weight 1, rows 1, 4, ... with
// weight 5 (a loss mask is each token's weight: prepare --decision-weight).
struct Case {
  Bf16Matrix logits;
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;
  std::vector<float> lf;   // dense (N, V) copies for the CPU op
  std::vector<double> ld;
  const uint8_t* mask_ptr() const { return mask.empty() ? nullptr : mask.data(); }
};

Case make_case(const Shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  Case k{Bf16Matrix(s.N, s.V), {}, {}, {}, {}};
  std::normal_distribution<float> normal(0.f, s.scale > 0 ? s.scale : 1.f);
  std::uniform_real_distribution<float> uni(-std::fabs(s.scale), std::fabs(s.scale));
  std::uniform_int_distribution<int> tgt(0, s.V - 1);
  for (int i = 0; i < s.N; ++i)
    for (int c = 0; c < s.V; ++c) k.logits.at(i, c) = __float2bfloat16(s.scale > 0 ? normal(rng) : uni(rng));
  if (s.use_mask)
    for (int i = 0; i < s.N; ++i) k.mask.push_back(i % 3 == 2 ? 0 : i % 3 == 1 ? 5 : 1);
  for (int i = 0; i < s.N; ++i) k.targets.push_back(k.mask.empty() || k.mask[i] ? tgt(rng) : -1);
  k.lf.resize(static_cast<size_t>(s.N) * s.V);
  k.ld.resize(k.lf.size());
  for (int i = 0; i < s.N; ++i)
    for (int c = 0; c < s.V; ++c) k.lf[i * s.V + c] = k.ld[i * s.V + c] = k.logits.get(i, c);
  return k;
}

TEST(CrossentropySim, ForwardMatchesCpuAndFp64) {
  for (const Shape& s : lt::kernelcases::kCrossentropy) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    const unsigned seed = s.seed(1);
    std::printf("[crossentropy fwd] N=%d V=%d scale=%g mask=%d seed=%u\n", s.N, s.V, s.scale, s.use_mask, seed);
    Case k = make_case(s, seed);
    std::vector<float> losses(s.N + 1, kSentinel), lse(s.N + 1, kSentinel);
    double loss_sum = -1.0;

    lt::cuda::CrossentropyForwardParams p;
    p.losses = losses.data(), p.lse = lse.data(), p.loss_sum = &loss_sum;
    p.logits = k.logits.data.data(), p.targets = k.targets.data(), p.mask = k.mask_ptr();
    p.N = s.N, p.V = s.V, p.logits_row_stride = k.logits.stride;
    lt::cuda::crossentropy_forward_cuda(p, nullptr);

    std::vector<float> loss32(s.N), lse32(s.N);
    std::vector<double> loss64(s.N), lse64(s.N);
    const double sum32 = lt::cpu::crossentropy_forward(loss32.data(), lse32.data(), k.lf.data(), k.targets.data(),
                                                       k.mask_ptr(), s.N, s.V);
    const double sum64 = lt::cpu::crossentropy_forward(loss64.data(), lse64.data(), k.ld.data(), k.targets.data(),
                                                       k.mask_ptr(), s.N, s.V);
    (void)sum32;

    ErrorReport loss_k, loss_n, lse_k, lse_n;
    bool fp32_ok = true, masked_zero = true;
    double sum_tol = 0.0;
    for (int i = 0; i < s.N; ++i) {
      loss_k.add(i, 0, losses[i], loss64[i]);
      loss_n.add(i, 0, bf(loss32[i]), loss64[i]);
      lse_k.add(i, 0, lse[i], lse64[i]);
      lse_n.add(i, 0, bf(lse32[i]), lse64[i]);
      // fp32: lse = m + log(s), s an fp32 sum of V exps (relative error ~ eps (V/256 + 16)).
      const double tol = 2.4e-7 * (2.0 * std::fabs(lse64[i]) + 16.0 + s.V / 256.0);
      if (!(std::fabs(lse[i] - lse64[i]) <= tol)) fp32_ok = false;
      const bool in = k.mask.empty() || k.mask[i];
      if (in) {
        const double w = k.mask.empty() ? 1.0 : k.mask[i];
        if (!(std::fabs(losses[i] - loss64[i]) <= w * tol)) fp32_ok = false;
        sum_tol += w * tol;
      } else if (losses[i] != 0.f) {
        masked_zero = false;
      }
    }
    std::printf("  %s\n  %s\n  %s\n  %s\n  loss kernel/naive ratio %.3g, lse kernel/naive ratio %.3g\n"
                "  loss sum %.10g, fp64 %.10g, |err| %.3e\n",
                describe("loss kernel vs fp64", loss_k).c_str(), describe("loss naive bf16 vs fp64", loss_n).c_str(),
                describe("lse kernel vs fp64", lse_k).c_str(), describe("lse naive bf16 vs fp64", lse_n).c_str(),
                ratio(loss_k, loss_n), ratio(lse_k, lse_n), loss_sum, sum64, std::fabs(loss_sum - sum64));
    EXPECT_TRUE(loss_k.finite && lse_k.finite && std::isfinite(loss_sum)) << "N=" << s.N << " V=" << s.V;
    EXPECT_LE(loss_k.worst, 2.0 * loss_n.worst) << describe("loss kernel vs fp64", loss_k);
    EXPECT_LE(lse_k.worst, 2.0 * lse_n.worst) << describe("lse kernel vs fp64", lse_k);
    EXPECT_TRUE(fp32_ok) << describe("loss", loss_k) << "; " << describe("lse", lse_k);
    EXPECT_TRUE(masked_zero) << "masked rows must have loss 0";
    EXPECT_LE(std::fabs(loss_sum - sum64), sum_tol + 1e-12) << "loss sum";
    EXPECT_EQ(losses[s.N], kSentinel) << "losses written past N";
    EXPECT_EQ(lse[s.N], kSentinel) << "lse written past N";
  }
}

// Backward from the kernel's own fp32 lse cache (the same cache feeds the references), once out of
// place and once in place over the logits.
TEST(CrossentropySim, BackwardMatchesCpuAndFp64) {
  for (const Shape& s : lt::kernelcases::kCrossentropy) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    for (const bool in_place : {false, true}) {
      const unsigned seed = s.seed(2);
      std::printf("[crossentropy bwd] N=%d V=%d scale=%g mask=%d in_place=%d seed=%u\n", s.N, s.V, s.scale,
                  s.use_mask, in_place, seed);
      Case k = make_case(s, seed);
      std::vector<float> losses(s.N), lse(s.N);
      lt::cuda::CrossentropyForwardParams fp;
      fp.losses = losses.data(), fp.lse = lse.data();
      fp.logits = k.logits.data.data(), fp.targets = k.targets.data(), fp.mask = k.mask_ptr();
      fp.N = s.N, fp.V = s.V, fp.logits_row_stride = k.logits.stride;
      lt::cuda::crossentropy_forward_cuda(fp, nullptr);

      Bf16Matrix out_of_place(s.N, s.V);
      Bf16Matrix& dl = in_place ? k.logits : out_of_place;
      lt::cuda::CrossentropyBackwardParams p;
      p.dlogits = dl.data.data(), p.logits = k.logits.data.data(), p.lse = lse.data();
      p.targets = k.targets.data(), p.mask = k.mask_ptr(), p.dloss = kDloss;
      p.N = s.N, p.V = s.V, p.dlogits_row_stride = dl.stride, p.logits_row_stride = k.logits.stride;
      lt::cuda::crossentropy_backward_cuda(p, nullptr);

      const std::vector<double> lse_d(lse.begin(), lse.end());
      std::vector<float> d32(k.lf.size());
      std::vector<double> d64(k.ld.size());
      lt::cpu::crossentropy_backward(d32.data(), k.lf.data(), lse.data(), k.targets.data(), k.mask_ptr(), kDloss,
                                     s.N, s.V);
      lt::cpu::crossentropy_backward(d64.data(), k.ld.data(), lse_d.data(), k.targets.data(), k.mask_ptr(), kDloss,
                                     s.N, s.V);
      ErrorReport kern, naive;
      bool masked_zero = true;
      for (int i = 0; i < s.N; ++i)
        for (int c = 0; c < s.V; ++c) {
          const double ref = d64[i * s.V + c];
          kern.add(i, c, dl.get(i, c), ref);
          naive.add(i, c, bf(d32[i * s.V + c]), ref);
          if (!k.mask.empty() && !k.mask[i] && dl.get(i, c) != 0.f) masked_zero = false;
        }
      std::printf("  %s\n  %s\n  dlogits kernel/naive ratio %.3g\n", describe("dlogits kernel vs fp64", kern).c_str(),
                  describe("dlogits naive bf16 vs fp64", naive).c_str(), ratio(kern, naive));
      EXPECT_TRUE(kern.finite) << "N=" << s.N << " V=" << s.V;
      EXPECT_LE(kern.worst, 2.0 * naive.worst) << describe("dlogits kernel vs fp64", kern);
      EXPECT_TRUE(masked_zero) << "masked rows must have dlogits 0";
      EXPECT_EQ(dl.touched_padding(), 0) << "N=" << s.N << " V=" << s.V;
      // Each row's gradient sums to ~0 (softmax sums to 1): a check independent of the CPU op.
      for (int i = 0; i < s.N; ++i) {
        double row_sum = 0.0;
        for (int c = 0; c < s.V; ++c) row_sum += dl.get(i, c);
        const double w = k.mask.empty() ? 1.0 : k.mask[i];
        EXPECT_NEAR(row_sum, 0.0, w * kDloss * (0.01 + 4e-3 * std::sqrt(static_cast<double>(s.V)))) << "row " << i;
      }
    }
  }
}

// The loss sum has a fixed order: two runs give identical bits, equal to the row-order sum within
// double rounding. Also N = 0 gives a zero sum.
TEST(CrossentropySim, LossSumIsDeterministic) {
  const Shape s{300, 40, 3.f, true};  // more rows than the sum block has threads
  const unsigned seed = s.seed(3);
  std::printf("[crossentropy sum determinism] N=%d V=%d seed=%u\n", s.N, s.V, seed);
  Case k = make_case(s, seed);
  std::vector<float> losses(s.N), lse(s.N);
  double a = -1.0, b = -2.0;
  lt::cuda::CrossentropyForwardParams p;
  p.losses = losses.data(), p.lse = lse.data();
  p.logits = k.logits.data.data(), p.targets = k.targets.data(), p.mask = k.mask_ptr();
  p.N = s.N, p.V = s.V, p.logits_row_stride = k.logits.stride;
  p.loss_sum = &a;
  lt::cuda::crossentropy_forward_cuda(p, nullptr);
  p.loss_sum = &b;
  lt::cuda::crossentropy_forward_cuda(p, nullptr);
  EXPECT_EQ(a, b);
  double row_order = 0.0;
  for (float v : losses) row_order += v;
  EXPECT_NEAR(a, row_order, 1e-12 * std::fabs(row_order));
  EXPECT_GT(a, 0.0);
  double empty = -1.0;
  p.N = 0, p.loss_sum = &empty;
  lt::cuda::crossentropy_forward_cuda(p, nullptr);
  EXPECT_EQ(empty, 0.0);
}

}  // namespace
