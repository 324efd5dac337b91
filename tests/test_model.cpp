// Model-level tests: the parameter layout, a whole-model gradient check in fp64 against
// central finite differences, float vs double agreement, and the inference decoder against
// the training forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "llamatrain/config.h"
#include "llamatrain/inference.h"
#include "llamatrain/model.h"
#include "llamatrain/rng.h"
#include "model_compare.h"

namespace lt {
namespace {

Llama2Config small_config() { return testing::finite_difference_config(); }

struct TestBatch {
  int B, T;
  std::vector<int32_t> inputs, targets, pos, seg;
  std::vector<uint8_t> mask;
  Batch batch(bool packed) const {
    Batch b;
    b.B = B;
    b.T = T;
    b.inputs = inputs.data();
    b.targets = targets.data();
    b.loss_mask = mask.data();
    if (packed) {
      b.pos = pos.data();
      b.seg_start = seg.data();
    }
    return b;
  }
};

// Two rows; row 1 packs two examples (boundary at t=3) and some targets carry no loss.
TestBatch make_batch(int V, uint64_t seed) {
  TestBatch tb{2, 7, {}, {}, {}, {}, {}};
  Rng rng(seed);
  const int N = tb.B * tb.T;
  for (int i = 0; i < N; ++i) {
    tb.inputs.push_back(int32_t(rng.below(uint64_t(V))));
    tb.targets.push_back(int32_t(rng.below(uint64_t(V))));
    tb.mask.push_back(i % 5 == 2 ? 0 : 1);
  }
  for (int b = 0; b < tb.B; ++b)
    for (int t = 0; t < tb.T; ++t) {
      const int start = (b == 1 && t >= 3) ? 3 : 0;
      tb.seg.push_back(start);
      tb.pos.push_back(t - start);
    }
  return tb;
}

TEST(ParameterLayout, NamesShapesAndOffsetsAreContiguous) {
  for (const std::string preset : {"tiny", "stories260k", "llama2-7b", "llama2-70b"}) {
    const Llama2Config c = preset_config(preset);
    ParameterLayout layout(c);
    size_t off = 0;
    for (const auto& t : layout.tensors()) {
      EXPECT_EQ(t.offset, off) << preset << " " << t.name;
      off += t.numel;
    }
    EXPECT_EQ(off, layout.total());
    EXPECT_EQ(int64_t(layout.total()), c.num_parameters()) << preset;
    EXPECT_EQ(layout.find("layers.0.attention.wk.weight").shape,
              (std::vector<int64_t>{c.kv_dim(), c.dim}));
    EXPECT_FALSE(layout.find("norm.weight").weight_decay);
    EXPECT_EQ(layout.try_find("output.weight") == nullptr, c.tied_embeddings) << preset;
    // The blocks the pass acquires (param_blocks.h) tile the buffer: embeddings, layers, head.
    ASSERT_EQ(layout.blocks.size(), size_t(c.n_layers + 2)) << preset;
    size_t at = 0;
    for (const auto& b : layout.blocks) {
      EXPECT_EQ(b.begin, at) << preset;
      at = b.end;
    }
    EXPECT_EQ(at, layout.total()) << preset;
    EXPECT_EQ(layout.blocks[1].begin, layout.layers[0].attention_norm) << preset;
    EXPECT_EQ(layout.blocks.back().begin, layout.norm) << preset;
  }
  // Published sizes: Llama-2-7b 6.74e9, 13b 13.0e9, 70b 69.0e9 parameters.
  EXPECT_EQ(preset_config("llama2-7b").num_parameters(), 6738415616);
  EXPECT_EQ(preset_config("llama2-13b").num_parameters(), 13015864320);
  EXPECT_EQ(preset_config("llama2-70b").num_parameters(), 68976648192);
}

// ZeRO stage 3 initialises only its shard: any cut of the flat range gives the whole model's
// values (seed 11; cuts inside tensors and chunks).
TEST(Llama2Model, InitRandomRangeIsTheWholeInitialisationsSlice) {
  for (bool tied : {false, true}) {
    Llama2Config c = preset_config("tiny");
    c.tied_embeddings = tied;
    Llama2Model whole(c);
    whole.init_random(11);
    const size_t n = whole.layout().total();
    const size_t cuts[] = {0, 7, n / 3 + 5, 2 * n / 3 - 1, n};
    for (int k = 0; k < 4; ++k) {
      std::vector<float> part(cuts[k + 1] - cuts[k], -1.f);
      Llama2Model::init_random_range(c, whole.layout(), 11, cuts[k], cuts[k + 1], part.data());
      for (size_t i = 0; i < part.size(); ++i)
        ASSERT_EQ(part[i], whole.params()[cuts[k] + i]) << "tied " << tied << ", flat element " << cuts[k] + i;
    }
  }
}

TEST(Llama2Config, ValidateNamesTheField) {
  Llama2Config c = preset_config("tiny");
  c.n_kv_heads = 3;
  try {
    c.validate();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_heads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(preset_config("llama3-8b"), std::exception);
}

// Whole-model gradient in fp64: every tensor, a handful of elements each, against central
// differences of the summed masked loss; packed rows (positions restart, attention stays
// inside each example) and a partial loss mask included.
TEST(Llama2Model, WholeModelGradientMatchesFiniteDifferencesFp64) {
  const uint64_t seed = 20261129;
  std::printf("seed=%llu\n", (unsigned long long)seed);
  const Llama2Config cfg = small_config();
  Llama2ModelT<double> model(cfg);
  model.init_random(seed);
  // Larger weights than the initialiser's 0.02 so every path carries a visible gradient.
  Rng rng(seed + 1);
  for (auto& p : model.params()) p += 0.3 * rng.normal();
  model.allocate_grads();
  const TestBatch tb = make_batch(cfg.vocab_size, seed + 2);
  for (bool packed : {false, true}) {
    const Batch b = tb.batch(packed);
    model.clear_grads();
    model.forward(b);
    const float dloss = 0.37f;
    model.backward(b, dloss);
    double worst = 0;
    std::string worst_at;
    for (const auto& t : model.layout().tensors()) {
      for (int k = 0; k < 6; ++k) {
        const size_t i = t.offset + size_t(rng.below(t.numel));
        const double saved = model.params()[i];
        const double h = 1e-5;
        model.params()[i] = saved + h;
        const double lp = model.forward(b);
        model.params()[i] = saved - h;
        const double lm = model.forward(b);
        model.params()[i] = saved;
        const double numeric = double(dloss) * (lp - lm) / (2 * h);
        const double analytic = model.grads()[i];
        const double err = std::abs(numeric - analytic) / std::max(1e-6, std::abs(numeric) + std::abs(analytic));
        if (err > worst) {
          worst = err;
          char buf[200];
          std::snprintf(buf, sizeof buf, "%s[%zu] analytic %.10g numeric %.10g", t.name.c_str(), i - t.offset,
                        analytic, numeric);
          worst_at = buf;
        }
      }
    }
    std::printf("packed=%d worst relative error %.3g at %s\n", int(packed), worst, worst_at.c_str());
    EXPECT_LT(worst, 1e-5) << "packed=" << packed << " worst at " << worst_at;
  }
}

// The packed row's loss equals the sum of its examples' losses run alone (positions restart and
// attention does not cross the boundary).
TEST(Llama2Model, PackedRowEqualsExamplesRunAlone) {
  const Llama2Config cfg = small_config();
  Llama2ModelT<double> model(cfg);
  model.init_random(7);
  const TestBatch tb = make_batch(cfg.vocab_size, 11);
  std::vector<double> packed_losses(size_t(tb.B * tb.T));
  model.forward(tb.batch(true), packed_losses.data());
  // Row 1, examples [0,3) and [3,7).
  for (auto [start, len] : {std::pair<int, int>{0, 3}, {3, 4}}) {
    Batch b;
    b.B = 1;
    b.T = len;
    b.inputs = tb.inputs.data() + tb.T + start;
    b.targets = tb.targets.data() + tb.T + start;
    b.loss_mask = tb.mask.data() + tb.T + start;
    std::vector<double> alone(static_cast<size_t>(len));
    model.forward(b, alone.data());
    for (int t = 0; t < len; ++t)
      EXPECT_NEAR(alone[size_t(t)], packed_losses[size_t(tb.T + start + t)], 1e-12) << "t=" << start + t;
  }
}

TEST(Llama2Model, FloatMatchesDoubleForward) {
  const Llama2Config cfg = small_config();
  Llama2ModelT<double> md(cfg);
  md.init_random(3);
  Llama2ModelT<float> mf(cfg);
  for (size_t i = 0; i < md.params().size(); ++i) mf.params()[i] = float(md.params()[i]);
  const TestBatch tb = make_batch(cfg.vocab_size, 5);
  const double ld = md.forward(tb.batch(true));
  const double lf = mf.forward(tb.batch(true));
  EXPECT_NEAR(lf, ld, 1e-5 * std::abs(ld)) << "float " << lf << " double " << ld;
}

// The KV-cache decoder gives the training forward's logits at every position.
TEST(Decoder, MatchesBatchedForwardLogits) {
  Llama2Config cfg = small_config();
  Llama2Model model(cfg);
  model.init_random(9);
  const TestBatch tb = make_batch(cfg.vocab_size, 13);
  Batch b;
  b.B = 1;
  b.T = tb.T;
  b.inputs = tb.inputs.data();
  model.forward(b);
  std::vector<float> ref(model.logits(), model.logits() + size_t(tb.T) * cfg.vocab_size);
  CpuDecoder dec(model, cfg.max_seq_len);
  double worst = 0;
  for (int t = 0; t < tb.T; ++t) {
    const auto& logits = dec.step(tb.inputs[size_t(t)], t);
    for (int j = 0; j < cfg.vocab_size; ++j)
      worst = std::max(worst, double(std::abs(logits[size_t(j)] - ref[size_t(t) * cfg.vocab_size + j])));
  }
  EXPECT_LT(worst, 1e-5) << "worst absolute logit difference";
}

TEST(Sampler, GreedyAndTopP) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  Sampler greedy(0.f, 0.9f, 1);
  EXPECT_EQ(greedy.sample(logits), 1);
  // top_p tiny: only the most probable token survives.
  Sampler nucleus(1.0f, 0.01f, 42);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(nucleus.sample(logits), 1);
  // Full sampling visits several tokens with frequencies close to softmax.
  Sampler full(1.0f, 1.0f, 42);
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 20000; ++i) counts[size_t(full.sample(logits))]++;
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(counts[size_t(j)] / 20000.0, std::exp(logits[size_t(j)]) / z, 0.015) << j;
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// init_random draws its values in parallel chunks (each thread jumps ahead in splitmix64's
// stream); they must be those of one sequential Rng over the tensors in layout order, so that a
// seed gives the same model whatever the thread count. The embedding (600 x 128) spans two chunks.
TEST(Llama2Model, InitRandomIsTheSequentialStream) {
  Llama2Config cfg = preset_config("tiny");
  cfg.dim = 128;
  cfg.hidden_dim = 160;
  cfg.vocab_size = 600;
  Llama2Model model(cfg);
  model.init_random(11);
  Rng rng(11);
  const double std_resid = 0.02 / std::sqrt(2.0 * cfg.n_layers);
  size_t checked = 0;
  for (const auto& t : model.layout().tensors()) {
    const float* p = model.params().data() + t.offset;
    const bool resid = t.name.find("attention.wo") != std::string::npos ||
                       t.name.find("feed_forward.w2") != std::string::npos;
    for (size_t i = 0; i < t.numel; ++i) {
      const float want = t.weight_decay ? float((resid ? std_resid : 0.02) * rng.normal()) : 1.0f;
      ASSERT_EQ(p[i], want) << t.name << "[" << i << "]";
    }
    checked += t.numel;
  }
  EXPECT_GT(checked, size_t(1) << 17);
}

}  // namespace
}  // namespace lt
