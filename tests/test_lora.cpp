// LoRA (lora.h) in the model's passes: the adapters' gradients in fp64 against central finite
// differences (with and without dropout), a frozen base (no gradient of it is computed), an untrained
// adapter changing nothing, merged against unmerged, the same bits in every recompute mode, and the
// option parsing's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "model_compare.h"
#include "test_util.h"
#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/lora.h"
#include "llamatrain/model.h"
#include "llamatrain/peft_adapter.h"
#include "llamatrain/rng.h"
#include "llamatrain/safetensors.h"

namespace lt {
namespace {

Llama2Config lora_test_config() { return testing::finite_difference_config(); }

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
  // Six elements of every A and every B (the passes are too small to thread well: all 1392 of them
  // took 20 s on 2 threads).
  std::vector<size_t> elements;
  Rng rng(77);
  const int r = m.lora()->config().rank;
  for (const LoraSite& s : m.lora()->sites())
    for (int k = 0; k < 6; ++k) {
      elements.push_back(s.a + size_t(rng.below(uint64_t(r) * s.in)));
      elements.push_back(s.b + size_t(rng.below(uint64_t(r) * s.out)));
    }
  double worst = 0;
  for (size_t i : elements) {
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
    std::printf("dropout %.1f: 12 elements of each of %zu adapters, worst relative error %.3g at %s\n", dropout,
                m.lora()->sites().size(), worst, where.c_str());
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

// An adapter with random A and B on q, k, v and down_proj of the test model.
std::vector<float> random_adapter(const LoraLayout& layout, uint64_t seed) {
  std::vector<float> p(layout.total());
  Rng rng(seed);
  for (float& v : p) v = float(rng.normal());
  return p;
}

TEST(PeftAdapter, RoundTripKeepsEveryBitAndHfRowOrder) {
  const Llama2Config cfg = lora_test_config();
  LoraConfig lc;
  lc.rank = 3, lc.alpha = 6, lc.dropout = 0.05f, lc.targets = parse_lora_targets("wq,wk,wv,w2");
  const LoraLayout layout(cfg, lc);
  const std::vector<float> p = random_adapter(layout, 41);
  const std::string dir = (testing::scratch_dir() / "adapter").string();
  write_peft_adapter(dir, cfg, layout, p.data(), "base.h5");
  const PeftAdapter back = read_peft_adapter(dir, cfg);
  EXPECT_EQ(back.config.rank, 3);
  EXPECT_EQ(back.config.alpha, 6.f);
  EXPECT_EQ(back.config.dropout, 0.05f);
  EXPECT_EQ(lora_targets_string(back.config.targets), "wq,wk,wv,w2");
  ASSERT_EQ(back.params.size(), p.size());
  size_t differ = 0;
  for (size_t i = 0; i < p.size(); ++i) differ += back.params[i] != p[i];
  EXPECT_EQ(differ, 0u);
  // In the file: PEFT's names and config, q_proj's B in the HF export's row order, v_proj's as is.
  const auto j = nlohmann::json::parse(read_file_bytes(dir + "/adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "k_proj", "v_proj", "down_proj"}));
  const safetensors::Reader st(dir + "/adapter_model.safetensors");
  EXPECT_EQ(st.header().tensors.size(), layout.sites().size() * 2);
  const LoraSite& q = *layout.find(1, LoraTarget::kWq);
  const safetensors::TensorEntry* tq = st.header().find("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight");
  ASSERT_TRUE(tq);
  std::vector<float> file_b(size_t(tq->numel())), want(file_b.size());
  st.read_f32(*tq, file_b.data());
  hf_permute_from_meta(want.data(), p.data() + q.b, cfg.n_heads, cfg.head_dim(), lc.rank);
  EXPECT_EQ(file_b, want);
  EXPECT_NE(file_b, std::vector<float>(p.begin() + std::ptrdiff_t(q.b), p.begin() + std::ptrdiff_t(q.b + file_b.size())));
}

TEST(PeftAdapter, RefusesWhatItCannotApplyNamingTheFieldOrTensor) {
  const Llama2Config cfg = lora_test_config();
  LoraConfig lc;
  lc.rank = 2, lc.targets = parse_lora_targets("wq,wo");
  const LoraLayout layout(cfg, lc);
  const std::vector<float> p = random_adapter(layout, 42);
  const std::string dir = (testing::scratch_dir() / "adapter").string();
  auto write_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    write_peft_adapter(dir, cfg, layout, p.data(), "base");
    auto j = nlohmann::json::parse(read_file_bytes(dir + "/adapter_config.json"));
    edit(j);
    write_file_atomic(dir + "/adapter_config.json", j.dump());
  };
  auto error = [&] { return testing::error_of([&] { read_peft_adapter(dir, cfg); }); };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j["use_dora"] = true; }, "use_dora is set"},
      {[](nlohmann::json& j) { j["bias"] = "all"; }, "bias: only \"none\""},
      {[](nlohmann::json& j) { j["peft_type"] = "IA3"; }, "peft_type: expected \"LORA\""},
      {[](nlohmann::json& j) { j["target_modules"] = {"q_proj", "lm_head"}; }, "'lm_head' is not one of"},
      {[](nlohmann::json& j) { j["r"] = 4; }, "has shape [2,16], expected [4,16]"},
      {[](nlohmann::json& j) { j["target_modules"] = {"q_proj", "o_proj", "up_proj"}; }, "up_proj.lora_A.weight is missing"},
      {[](nlohmann::json& j) { j["target_modules"] = {"q_proj"}; }, "holds 8 tensors, 4 of them"},
      {[](nlohmann::json& j) { j.erase("lora_alpha"); }, "expected r (integer), lora_alpha"},
  };
  for (const auto& [edit, want] : cases) {
    write_config(edit);
    const std::string e = error();
    EXPECT_NE(e.find(want), std::string::npos) << "want '" << want << "', got: " << e;
    EXPECT_NE(e.find("adapter"), std::string::npos) << "names the file: " << e;
  }
}

}  // namespace
}  // namespace lt
