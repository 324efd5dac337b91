// ZeRO stages 2 and 3 on the CPU (zero_blocks.h) under real MPI (CommMpi.np2, .np3): the passes
// through the blocks give the loss of the plain flat model bit for bit (the gathered weights are
// the same bits), and the gradient shard each rank ends with is its part of the gradient summed
// over every rank's micro-batches, with one rank computing an extra micro-batch that the others
// join idle. Tied and untied heads (the tied one holds block 0 through the whole pass).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/model.h"
#include "llamatrain/rng.h"
#include "llamatrain/zero.h"

namespace lt {
namespace {

Llama2Config blocks_config(bool tied) {
  Llama2Config c = preset_config("tiny");
  c.dim = 24;
  c.hidden_dim = 40;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 37;
  c.max_seq_len = 16;
  c.tied_embeddings = tied;
  return c;
}

struct Tokens {
  std::vector<int32_t> inputs, targets;
  Tokens(int n, int V, uint64_t seed) {
    Rng rng(seed);
    for (int i = 0; i < n; ++i) {
      inputs.push_back(int32_t(rng.below(uint64_t(V))));
      targets.push_back(int32_t(rng.below(uint64_t(V))));
    }
  }
  Batch batch(int B, int T) const {
    Batch b;
    b.B = B, b.T = T, b.inputs = inputs.data(), b.targets = targets.data();
    return b;
  }
};

void check_stage(int stage, bool tied, DType grad = DType::kF32) {
  Comm& comm = world_comm();
  const int W = comm.size(), r = comm.rank();
  const Llama2Config cfg = blocks_config(tied);
  const int B = 2, T = 12;
  // Rank r computes micro-batches seeded 100 r + k for k < 1 + (r == 0): rank 0 has two.
  const int mine = r == 0 ? 2 : 1, rounds = 2;
  std::printf("[rank %d] ZeRO stage %d, %s head, %s gradients, %d ranks, seeds 100 r + k, weights seed 5\n", r,
              stage, tied ? "tied" : "untied", dtype_name(grad), W);

  // The reference: every rank's flat gradient, summed over ranks.
  Llama2Model flat(cfg);
  flat.init_random(5);
  flat.allocate_grads();
  std::vector<double> flat_losses;
  for (int k = 0; k < mine; ++k) {
    const Tokens t(B * T, cfg.vocab_size, uint64_t(100 * r + k));
    flat_losses.push_back(flat.forward(t.batch(B, T)));
    flat.backward(t.batch(B, T), 0.01f);
  }
  const size_t n = flat.layout().total();
  comm.allreduce_sum(flat.grads().data(), n);

  Llama2Model model(cfg);
  model.init_random(5);
  ZeroOptimizer zero(comm, model.layout(), stage, AdamWConfig{}, grad);
  std::vector<float> full = model.params();
  full.resize(zero.padded_size(), 0.f);
  if (stage == 2) model.params() = full;
  zero.shard_gradients(stage == 2 ? model.params().data() : full.data());
  if (stage == 3) std::vector<float>().swap(model.params());
  for (int k = 0; k < rounds; ++k) {
    if (k >= mine) {
      idle_forward_blocks(zero.blocks(), model.layout());
      idle_backward_blocks(zero.blocks(), model.layout());
      continue;
    }
    const Tokens t(B * T, cfg.vocab_size, uint64_t(100 * r + k));
    EXPECT_EQ(model.forward(t.batch(B, T), zero.blocks()), flat_losses[size_t(k)]) << "micro-batch " << k;
    model.backward(t.batch(B, T), 0.01f, zero.blocks());
  }
  // Summed in another order (per micro-batch over ranks, then over micro-batches): each element
  // within 1e-5 of its tensor's largest gradient, the worst one reported. bf16: each rank's
  // addend rounded to nearest (2^-9 of it), each pair sum of the wire likewise, and each of the two
  // rounds' stochastic rounding into the shard (below 2^-7 of the sum): within 2^-5 of the
  // tensor's largest, and the mean error over the shard within 2^-9 (unbiased rounding).
  double mean_err = 0;
  size_t counted = 0;
  double worst = 0;
  size_t worst_at = 0;
  const std::vector<float> g = zero.shard_grads().to_f32();
  for (const TensorInfo& t : model.layout().tensors()) {
    const size_t lo = std::max(t.offset, zero.own_begin()), hi = std::min(t.offset + t.numel, zero.own_end());
    if (lo >= hi) continue;
    float scale = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) scale = std::max(scale, std::abs(flat.grads()[i]));
    for (size_t i = lo; i < hi; ++i) {
      const double rel = std::abs(double(g[i - zero.own_begin()]) - double(flat.grads()[i])) / double(scale);
      if (rel > worst) worst = rel, worst_at = i;
      mean_err += (double(g[i - zero.own_begin()]) - double(flat.grads()[i])) / double(scale), ++counted;
    }
  }
  mean_err /= double(std::max<size_t>(counted, 1));
  if (grad == DType::kF32) EXPECT_LT(worst, 1e-5) << "rank " << r << ", flat element " << worst_at;
  if (grad == DType::kBF16) {
    EXPECT_LT(worst, 1.0 / 32) << "rank " << r << ", flat element " << worst_at;
    EXPECT_LT(std::abs(mean_err), 1.0 / 512) << "rank " << r;
  }
  std::printf("[rank %d] shard [%zu, %zu): worst gradient difference %.3g of its tensor's largest at %zu; blocks held at most %zu "
              "bytes; mean signed difference %.3g\n", r, zero.own_begin(), zero.own_end(), worst, worst_at,
              zero.blocks().peak_bytes(), mean_err);
  // What the memory table counts for the blocks is what they held at most.
  EXPECT_EQ(double(zero.blocks().peak_bytes()), zero_block_bytes(model.layout(), stage));
}

TEST(ZeroBlocksMpi, Stage2GradientShardsAreTheSummedGradient) { check_stage(2, false); }
TEST(ZeroBlocksMpi, Stage3GradientShardsAreTheSummedGradient) { check_stage(3, false); }
TEST(ZeroBlocksMpi, Stage3WithATiedHead) { check_stage(3, true); }
TEST(ZeroBlocksMpi, Stage2Bf16GradientShards) { check_stage(2, false, DType::kBF16); }
TEST(ZeroBlocksMpi, Stage3Bf16GradientShardsTiedHead) { check_stage(3, true, DType::kBF16); }

}  // namespace
}  // namespace lt
