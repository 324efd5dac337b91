// LoRA (lora.h) in the model's passes: the adapters' gradients in fp64 against central finite
// differences (with and without dropout), a frozen base (no gradient of it is computed), an untrained
// adapter changing nothing, merged against unmerged, the same bits in every recompute mode, and the
// option parsing's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/lora.h"
#include "llamatrain/model.h"
#include "llamatrain/rng.h"

namespace lt {
namespace {

Llama2Config lora_test_config() {
  Llama2Config c = preset_config("tiny");  // GQA, untied head
  c.dim = 16;
  c.hidden_dim = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 19;
  c.max_seq_len = 16;
  return c;
}

struct Tokens {
  int B = 2, T = 7;
  std::vector<int32_t> inputs, targets;
  std::vector<uint8_t> mask;
  explicit Tokens(uint64_t seed, int V) {
    Rng rng(seed);
    for (int i = 0; i < B * T; ++i) {
      inputs.push_back(int32_t(rng.below(uint64_t(V))));
      targets.push_back(int32_t(rng.below(uint64_t(V))));
      mask.push_back(i % 5 == 2 ? 0 : 1);  // some tokens carry no loss
    }
  }
  Batch batch() const {
    Batch b;
    b.B = B, b.T = T, b.inputs = inputs.data(), b.targets = targets.data(), b.loss_mask = mask.data();
    return b;
  }
};

// A model with adapters on every target whose weights (base and B too) are large enough for every
// path to carry a visible gradient.
template <class T>
Llama2ModelT<T> model_with_adapters(const LoraConfig& lc, uint64_t seed) {
  Llama2ModelT<T> m(lora_test_config());
  m.init_random(seed);
  Rng rng(seed + 1);
  for (auto& p : m.params()) p += T(0.3 * rng.normal());
  m.enable_lora(lc, seed + 2);
  for (auto& p : m.lora_params()) p += T(0.3 * rng.normal());
  return m;
}

// Every adapter element's analytic gradient against central differences; returns the worst
// relative error and says where.
double worst_adapter_gradient_error(Llama2ModelT<double>& m, const Batch& b, std::string* where) {
  const float dloss = 0.43f;
  m.clear_grads();
  m.forward(b);
  m.backward(b, dloss);
  const std::vector<double> analytic = m.lora_grads();
  double worst = 0;
  for (size_t i = 0; i < m.lora_params().size(); ++i) {
    const double saved = m.lora_params()[i], h = 1e-5;
    m.lora_params()[i] = saved + h;
    const double lp = m.forward(b);
    m.lora_params()[i] = saved - h;
    const double lm = m.forward(b);
    m.lora_params()[i] = saved;
    const double numeric = double(dloss) * (lp - lm) / (2 * h);
    // The differences' rounding noise is about 1e-16 * |loss| / h ~ 1e-9 here: relative to at least 1e-4.
    const double err = std::abs(numeric - analytic[i]) / std::max(1e-4, std::abs(numeric) + std::abs(analytic[i]));
    if (err > worst) {
      worst = err;
      *where = strcat("adapter element ", i, ": analytic ", analytic[i], " numeric ", numeric);
    }
  }
  return worst;
}

TEST(Lora, AdapterGradientsMatchFiniteDifferencesFp64) {
  const uint64_t seed = 20261204;
  std::printf("seed=%llu\n", (unsigned long long)seed);
  for (float dropout : {0.f, 0.3f}) {
    LoraConfig lc;
    lc.rank = 3, lc.alpha = 5, lc.dropout = dropout;
    Llama2ModelT<double> m = model_with_adapters<double>(lc, seed);
    m.set_lora_dropout_stream(dropout > 0 ? 7 : 0);  // one mask for every pass of the check
    const Tokens tok(seed + 3, m.config().vocab_size);
    std::string where;
    const double worst = worst_adapter_gradient_error(m, tok.batch(), &where);
    std::printf("dropout %.1f: %zu adapter elements, worst relative error %.3g at %s\n", dropout,
                m.lora_params().size(), worst, where.c_str());
    EXPECT_LT(worst, 1e-5) << "dropout " << dropout << ": " << where;
    EXPECT_TRUE(m.grads().empty()) << "a frozen base has no gradient buffer";
  }
}

TEST(Lora, DropoutChangesTheLossOnlyWhileAStreamIsSet) {
  LoraConfig lc;
  lc.rank = 2, lc.dropout = 0.5f;
  Llama2ModelT<double> m = model_with_adapters<double>(lc, 11);
  const Tokens tok(12, m.config().vocab_size);
  const double plain = m.forward(tok.batch());
  m.set_lora_dropout_stream(3);
  const double a = m.forward(tok.batch()), again = m.forward(tok.batch());
  m.set_lora_dropout_stream(4);
  const double other = m.forward(tok.batch());
  std::printf("no dropout %.12g, stream 3 %.12g (again %.12g), stream 4 %.12g\n", plain, a, again, other);
  EXPECT_EQ(a, again) << "one stream, one mask";
  EXPECT_NE(a, plain);
  EXPECT_NE(a, other);
}

TEST(Lora, UntrainedAdapterLeavesTheModelAsItWas) {
  const Llama2Config cfg = lora_test_config();
  Llama2Model base(cfg), adapted(cfg);
  base.init_random(5);
  adapted.params() = base.params();
  LoraConfig lc;
  lc.rank = 4;
  adapted.enable_lora(lc, 6);  // B = 0
  const Tokens tok(7, cfg.vocab_size);
  const double lb = base.forward(tok.batch()), la = adapted.forward(tok.batch());
  std::printf("base %.9g, with zero-B adapters %.9g\n", lb, la);
  EXPECT_EQ(lb, la);
  // PEFT's Kaiming-uniform A: within 1/sqrt(in), and not all zero.
  double amax = 0;
  for (const LoraSite& s : adapted.lora()->sites()) {
    for (int i = 0; i < lc.rank * s.in; ++i) {
      const double v = std::abs(adapted.lora_params()[s.a + size_t(i)]);
      EXPECT_LE(v, 1.0 / std::sqrt(double(s.in))) << LoraLayout::peft_name(s, false);
      amax = std::max(amax, v);
    }
    for (int i = 0; i < lc.rank * s.out; ++i) EXPECT_EQ(adapted.lora_params()[s.b + size_t(i)], 0.f);
  }
  EXPECT_GT(amax, 0.0);
}

TEST(Lora, MergedWeightsGiveTheSameLoss) {
  LoraConfig lc;
  lc.rank = 3, lc.alpha = 7;
  lc.targets = parse_lora_targets("wq,v_proj,wo,w2");
  Llama2ModelT<double> m = model_with_adapters<double>(lc, 21);
  Llama2ModelT<double> merged(m.config());
  merged.params() = m.params();
  merge_lora(*m.lora(), m.lora_params().data(), merged.layout(), merged.params().data());
  const Tokens tok(22, m.config().vocab_size);
  const double lu = m.forward(tok.batch()), lm = merged.forward(tok.batch());
  std::printf("unmerged %.15g merged %.15g relative %.3g\n", lu, lm, std::abs(lu - lm) / std::abs(lu));
  EXPECT_LT(std::abs(lu - lm), 1e-12 * std::abs(lu));
  EXPECT_EQ(m.lora()->sites().size(), size_t(2 * 4));
}

TEST(Lora, RecomputeModesGiveTheSameAdapterGradients) {
  LoraConfig lc;
  lc.rank = 2, lc.dropout = 0.2f;
  const Tokens tok(31, lora_test_config().vocab_size);
  std::vector<float> first;
  for (Recompute r : {Recompute::kNone, Recompute::kAttn, Recompute::kFull}) {
    Llama2Model m = model_with_adapters<float>(lc, 30);
    m.set_recompute(r);
    m.set_lora_dropout_stream(9);
    m.forward(tok.batch());
    m.backward(tok.batch(), 1.f);
    if (first.empty()) first = m.lora_grads();
    size_t differ = 0;
    for (size_t i = 0; i < first.size(); ++i) differ += first[i] != m.lora_grads()[i];
    EXPECT_EQ(differ, 0u) << "recompute " << recompute_name(r);
  }
}

TEST(Lora, OptionsAreChecked) {
  EXPECT_EQ(parse_lora_targets("wq,wk,wv,wo,w1,w2,w3"), 0x7fu);
  EXPECT_EQ(lora_targets_string(parse_lora_targets("up_proj,q_proj")), "wq,w3");
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { parse_lora_targets("wq,wx"); }).find("'wx' is not one of"), std::string::npos);
  EXPECT_NE(message([] { parse_lora_targets("wq,q_proj"); }).find("named twice"), std::string::npos);
  EXPECT_NE(message([] { parse_lora_targets(""); }).find("'' is not one of"), std::string::npos);
  LoraConfig lc;
  lc.rank = 0;
  EXPECT_NE(message([&] { lc.validate(); }).find("--lora-rank"), std::string::npos);
  lc.rank = 4, lc.dropout = 1.f;
  EXPECT_NE(message([&] { lc.validate(); }).find("--lora-dropout"), std::string::npos);
}

}  // namespace
}  // namespace lt
