// The gradient shard of ZeRO 2 and 3 (grad_shard.h): fp32 adds exactly; bf16 rounds each sum
// stochastically, so its expected value is the exact sum, and many addends below half a bf16 unit
// of the running sum still add up (rounded to nearest they would all be lost).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "llamatrain/grad_shard.h"
#include "llamatrain/safetensors.h"

namespace lt {
namespace {

using safetensors::bf16_to_f32;
using safetensors::f32_to_bf16;

TEST(GradShard, StochasticRoundingAveragesToTheValueExactly) {
  // Over all 2^16 random values, x rounds up (in magnitude) exactly (dropped bits) times: the
  // mean is x. Each result is one of x's two bf16 neighbours.
  for (float x : {1.0f + 3.0f / 1024.0f, -0.3f, 1e-30f, 12345.678f, 1.0f}) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const uint16_t down = uint16_t(bits >> 16);
    double sum = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const uint16_t y = bf16_round_stochastic(x, r);
      ASSERT_TRUE(y == down || y == down + 1) << x << " rounded to " << bf16_to_f32(y);
      sum += bf16_to_f32(y);
    }
    EXPECT_EQ(sum / 65536.0, double(x)) << "x = " << x;
  }
  EXPECT_TRUE(std::isinf(bf16_to_f32(bf16_round_stochastic(INFINITY, 123))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(bf16_round_stochastic(NAN, 123))));
}

TEST(GradShard, Fp32AddsExactly) {
  GradShard g;
  g.assign(5, DType::kF32);
  const float a[3] = {1.5f, -2.0f, 0.25f};
  g.add(1, a, 3);
  g.add(2, a, 3);
  const std::vector<float> v = g.to_f32();
  EXPECT_EQ(v, (std::vector<float>{0.f, 1.5f, -0.5f, -1.75f, 0.25f}));
  EXPECT_EQ(g.sum_squares(0, 5), 1.5 * 1.5 + 0.25 + 1.75 * 1.75 + 0.0625);
  EXPECT_EQ(g.bytes(), 20u);
}

TEST(GradShard, Bf16SumsOfSmallAddendsStayUnbiased) {
  // 4096 elements start at 1 and get 1000 addends of 1/1024 each: the exact sum is 1.9765625.
  // Rounded to nearest, every addend is below half a unit (2^-8) of 1 and is lost: the sum stays 1.
  const size_t n = 4096;
  const int adds = 1000;
  GradShard g;
  g.assign(n, DType::kBF16);
  EXPECT_EQ(g.bytes(), 2 * n);
  std::vector<float> one(n, 1.0f), tiny(n, 1.0f / 1024.0f);
  g.add(0, one.data(), n);
  for (int k = 0; k < adds; ++k) g.add(0, tiny.data(), n);
  const double exact = 1.0 + adds / 1024.0;
  const std::vector<float> v = g.to_f32();
  double mean = 0, worst = 0;
  for (float x : v) mean += x / double(n), worst = std::max(worst, std::abs(x - exact));
  std::printf("bf16 shard, %zu elements, 1 + %d x 2^-10: mean %.6f (exact %.6f), worst element off by %.4f\n", n,
              adds, mean, exact, worst);
  // Each element's sum is a random walk: an add rounds up with probability p = 2^-10 / 2^-7 (the
  // unit between 1 and 2), so its standard deviation is sqrt(adds p (1 - p)) units, 0.082. The
  // mean of the n sums within 4 of its standard deviations, the worst element within 6 of one sum's.
  const double sd = std::sqrt(adds * 0.125 * 0.875) / 128.0;
  EXPECT_NEAR(mean, exact, 4 * sd / std::sqrt(double(n)));
  EXPECT_LT(worst, 6 * sd);
  // Clipping's scale rounds to nearest.
  g.scale(0.5f);
  EXPECT_NEAR(g.sum_squares(0, n) / double(n), 0.25 * exact * exact, 0.02);
}

}  // namespace
}  // namespace lt
