// AdamW over shards of the layout, the LR schedule and clipping.
#include <gtest/gtest.h>

#include <cmath>

#include "llamatrain/optim.h"

namespace lt {
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1e-3f, 1e-4f, 10, 110};
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);   // (0+1)/10 of the peak
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);   // end of warm-up
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);  // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-4), 1e-9);  // half way
  EXPECT_NEAR(s.at(110), 1e-4, 1e-9);
  EXPECT_NEAR(s.at(500), 1e-4, 1e-9);  // stays at min after the end
}

TEST(AdamW, ShardedStepsEqualOneFullStepAndSkipDecayOnNorms) {
  Llama2Config c = preset_config("tiny");
  c.dim = 8;
  c.hidden_dim = 12;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 11;
  ParameterLayout layout(c);
  const size_t n = layout.total();
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.1f * float(i));
    g[i] = std::cos(0.37f * float(i));
  }
  AdamWConfig cfg;
  cfg.weight_decay = 0.5f;
  std::vector<float> full = p;
  AdamW whole(layout, 0, n, cfg);
  for (int t = 1; t <= 3; ++t) whole.step(full.data(), g.data(), 1e-2f, t);
  // Three uneven shards whose borders cut tensors.
  std::vector<float> sharded = p;
  const size_t cuts[] = {0, n / 3 + 5, 2 * n / 3 - 7, n};
  for (int s = 0; s < 3; ++s) {
    AdamW part(layout, cuts[s], cuts[s + 1], cfg);
    for (int t = 1; t <= 3; ++t) part.step(sharded.data(), g.data(), 1e-2f, t);
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(full[i], sharded[i]) << "element " << i;
  // A norm weight moves by the Adam step only; an embedding also decays. First step from p,
  // with m_hat = g, v_hat = g^2: update = lr * (sign(g) + wd * p) up to eps.
  std::vector<float> one = p;
  AdamW first(layout, 0, n, cfg);
  first.step(one.data(), g.data(), 1e-2f, 1);
  const size_t norm_i = layout.norm;
  const size_t emb_i = layout.tok_embeddings + 3;
  EXPECT_NEAR(one[norm_i], p[norm_i] - 1e-2f * (g[norm_i] > 0 ? 1.f : -1.f), 1e-6);
  EXPECT_NEAR(one[emb_i], p[emb_i] - 1e-2f * ((g[emb_i] > 0 ? 1.f : -1.f) + 0.5f * p[emb_i]), 1e-6);
}

TEST(ClipGradNorm, ScalesToMaxNormAndReportsTheNormBefore) {
  std::vector<float> g = {3.f, 4.f};
  EXPECT_NEAR(clip_grad_norm(g.data(), 2, 1.0f), 5.0, 1e-6);
  EXPECT_NEAR(std::hypot(g[0], g[1]), 1.0, 1e-5);
  std::vector<float> small = {0.3f, 0.4f};
  EXPECT_NEAR(clip_grad_norm(small.data(), 2, 1.0f), 0.5, 1e-6);
  EXPECT_FLOAT_EQ(small[0], 0.3f);
}

}  // namespace
}  // namespace lt
