// Activation recomputation on the CPU backend (src/model/llama2_pass.h): none, attn and full give
// the same loss and the same gradient bits, and activation_bytes follows each mode's buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/rng.h"

namespace lt {
namespace {

// GQA (4 heads over 2 KV heads), 3 layers so that a middle layer is recomputed between two
// others, and sizes that are not powers of two.
Llama2Config recompute_config() {
  Llama2Config c = preset_config("tiny");
  c.dim = 32;
  c.hidden_dim = 56;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 41;
  c.max_seq_len = 32;
  return c;
}

// B rows of T tokens packing examples of lengths 5, 9, 3, ... (positions and the first visible
// key restart at each), loss on every token but every fourth.
struct PackedBatch {
  int B, T;
  std::vector<int32_t> inputs, targets, pos, seg;
  std::vector<uint8_t> mask;
  PackedBatch(int b, int t, int V, uint64_t seed) : B(b), T(t) {
    Rng rng(seed);
    const int lengths[] = {5, 9, 3, 11, 7};
    for (int r = 0; r < B; ++r) {
      int start = 0, li = r;
      while (start < T) {
        const int len = std::min(lengths[li++ % 5], T - start);
        for (int i = 0; i < len; ++i) {
          pos.push_back(i);
          seg.push_back(start);
        }
        start += len;
      }
    }
    for (int i = 0; i < B * T; ++i) {
      inputs.push_back(int32_t(rng.below(uint64_t(V))));
      targets.push_back(int32_t(rng.below(uint64_t(V))));
      mask.push_back(i % 4 == 3 ? 0 : 1);
    }
  }
  Batch view() const {
    Batch b;
    b.B = B;
    b.T = T;
    b.inputs = inputs.data();
    b.targets = targets.data();
    b.loss_mask = mask.data();
    b.pos = pos.data();
    b.seg_start = seg.data();
    return b;
  }
};

struct RunResult {
  double loss1 = 0, loss2 = 0;
  std::vector<float> tok1, grads;
};

// Two micro-batches, each forward then backward, accumulated into the gradients.
RunResult run_two_micro_batches(const Llama2Config& cfg, Recompute r, uint64_t seed, const PackedBatch& b1,
                                const PackedBatch& b2) {
  Llama2Model m(cfg);
  m.init_random(seed);
  m.set_recompute(r);
  EXPECT_EQ(m.recompute(), r);
  m.allocate_grads();
  RunResult res;
  res.tok1.resize(size_t(b1.B) * b1.T);
  res.loss1 = m.forward(b1.view(), res.tok1.data());
  m.backward(b1.view(), 1.0f / 100);
  res.loss2 = m.forward(b2.view());
  m.backward(b2.view(), 1.0f / 100);
  res.grads = m.grads();
  return res;
}

// Bit-for-bit equality; on a difference, the count and the worst element with its tensor.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& ref, const ParameterLayout* layout,
                      const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  if (std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0) return;
  size_t differ = 0, worst = 0;
  double worst_e = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) == 0) continue;
    ++differ;
    const double e = std::fabs(double(got[i]) - double(ref[i]));
    if (!(e <= worst_e)) worst_e = e, worst = i;
  }
  std::string where;
  if (layout)
    for (const auto& t : layout->tensors())
      if (worst >= t.offset && worst < t.offset + t.numel) where = strcat(" (", t.name, "[", worst - t.offset, "])");
  ADD_FAILURE() << what << ": " << differ << " of " << got.size() << " elements differ; worst at " << worst << where
                << ": " << got[worst] << " vs " << ref[worst] << " (|diff| " << worst_e << ")";
}

TEST(Recompute, ModesGiveBitIdenticalLossAndGradients) {
  const uint64_t seed = 20261130;
  std::printf("[recompute cpu] seed=%llu\n", (unsigned long long)seed);
  const Llama2Config cfg = recompute_config();
  const PackedBatch b1(3, 29, cfg.vocab_size, seed + 1), b2(3, 29, cfg.vocab_size, seed + 2);
  const RunResult none = run_two_micro_batches(cfg, Recompute::kNone, seed, b1, b2);
  double norm = 0;
  for (float g : none.grads) norm += double(g) * g;
  std::printf("[recompute cpu] none: loss %.9g + %.9g, |grad| %.6g\n", none.loss1, none.loss2, std::sqrt(norm));
  ASSERT_GT(norm, 0.0);
  const ParameterLayout layout(cfg);
  for (Recompute r : {Recompute::kAttn, Recompute::kFull}) {
    const RunResult got = run_two_micro_batches(cfg, r, seed, b1, b2);
    const std::string name = recompute_name(r);
    std::printf("[recompute cpu] %s: loss %.9g + %.9g\n", name.c_str(), got.loss1, got.loss2);
    EXPECT_EQ(std::memcmp(&got.loss1, &none.loss1, sizeof(double)), 0) << name << " " << got.loss1 << " vs " << none.loss1;
    EXPECT_EQ(std::memcmp(&got.loss2, &none.loss2, sizeof(double)), 0) << name << " " << got.loss2 << " vs " << none.loss2;
    expect_same_bits(got.tok1, none.tok1, nullptr, name + " per-token losses");
    expect_same_bits(got.grads, none.grads, &layout, name + " gradients");
  }
}

// The buffers of each mode, written out from the header's list (fp32 throughout on the CPU):
// the residual stream (L+1)NC, per layer xn1, q, att, x2, xn2 (5C), k, v (2kv), h1, h3, hs (3F),
// rstd1, rstd2 (2) per token and lse (B H T); the final norm NC, logits NV, rstdf, losses, lse_ce
// (3N); the backward scratch N (5C + 2kv + 3F).
TEST(Recompute, ActivationBytesFollowTheMode) {
  const Llama2Config cfg = recompute_config();
  const size_t B = 4, T = 24, N = B * T, C = 32, F = 56, KV = 16, L = 3, V = 41, H = 4;
  const size_t common = (L + 1) * N * C + N * C + N * V + 3 * N + N * (5 * C + 2 * KV + 3 * F);
  const size_t attention = N * (2 * C + 2 * KV) + B * H * T;  // q, att, k, v, lse
  const size_t rest_of_layer = N * (3 * C + 3 * F) + 2 * N;   // xn1, x2, xn2, h1, h3, hs, rstd1, rstd2
  const size_t expect_none = 4 * (common + L * (attention + rest_of_layer));
  const size_t expect_attn = 4 * (common + attention + L * rest_of_layer);
  const size_t expect_full = 4 * (common + attention + rest_of_layer);
  Llama2Model m(cfg);
  EXPECT_EQ(m.activation_bytes(int(B), int(T)), expect_none);
  m.set_recompute(Recompute::kAttn);
  EXPECT_EQ(m.activation_bytes(int(B), int(T)), expect_attn);
  m.set_recompute(Recompute::kFull);
  EXPECT_EQ(m.activation_bytes(int(B), int(T)), expect_full);
  std::printf("[recompute cpu] activation bytes at B=%zu T=%zu: none %zu, attn %zu, full %zu\n", B, T, expect_none,
              expect_attn, expect_full);
  EXPECT_GT(expect_none, expect_attn);
  EXPECT_GT(expect_attn, expect_full);
}

// Changing the mode drops the activations: a backward() after it has no matching forward().
TEST(Recompute, ModeChangeBetweenForwardAndBackwardIsRefused) {
  const Llama2Config cfg = recompute_config();
  const PackedBatch b(2, 16, cfg.vocab_size, 3);
  Llama2Model m(cfg);
  m.init_random(3);
  m.allocate_grads();
  m.forward(b.view());
  m.set_recompute(Recompute::kFull);
  EXPECT_THROW(m.backward(b.view(), 1.0f), Error);
}

}  // namespace
}  // namespace lt
