// ZeRO stages 2 and 3 on one rank (the blocks' own code, which the sanitizer build runs; the
// collectives across ranks are tested under mpirun in tests/mpi/test_zero_blocks_mpi.cpp): a
// forward and backward through ZeroBlocks give the flat model's loss and gradient bits, in every
// recompute mode (full recompute acquires each layer again in backward), with tied and untied
// heads, and the blocks held at most what the memory table counts.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/model.h"
#include "llamatrain/rng.h"
#include "llamatrain/zero.h"

namespace lt {
namespace {

void check_one_rank(int stage, bool tied, Recompute recompute) {
  Llama2Config cfg = preset_config("tiny");
  cfg.dim = 16, cfg.hidden_dim = 24, cfg.n_layers = 2, cfg.n_heads = 2, cfg.n_kv_heads = 1, cfg.vocab_size = 19;
  cfg.max_seq_len = 8, cfg.tied_embeddings = tied;
  const int B = 2, T = 8;
  Rng rng(3);
  std::vector<int32_t> in, tg;
  for (int i = 0; i < B * T; ++i) in.push_back(int32_t(rng.below(19))), tg.push_back(int32_t(rng.below(19)));
  Batch b;
  b.B = B, b.T = T, b.inputs = in.data(), b.targets = tg.data();

  Llama2Model flat(cfg);
  flat.init_random(9);
  flat.allocate_grads();
  flat.set_recompute(recompute);
  const double flat_loss = flat.forward(b);
  flat.backward(b, 0.1f);

  auto self = make_self_comm();
  Llama2Model model(cfg, /*allocate_params=*/stage == 2);
  model.set_recompute(recompute);
  ZeroOptimizer zero(*self, model.layout(), stage, AdamWConfig{});
  if (stage == 2) model.params() = flat.params();
  zero.shard_gradients(stage == 2 ? model.params().data() : flat.params().data());
  EXPECT_EQ(model.forward(b, zero.blocks()), flat_loss);
  model.backward(b, 0.1f, zero.blocks());
  const std::vector<float> g = zero.shard_grads().to_f32();
  ASSERT_EQ(g.size(), flat.grads().size());
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], flat.grads()[i]) << "flat element " << i;
  EXPECT_EQ(double(zero.blocks().peak_bytes()), zero_block_bytes(model.layout(), stage));
}

TEST(ZeroBlocks, OneRankGivesTheFlatModelsBits) {
  for (int stage : {2, 3})
    for (bool tied : {false, true})
      for (Recompute r : {Recompute::kNone, Recompute::kAttn, Recompute::kFull}) {
        SCOPED_TRACE(::testing::Message() << "stage " << stage << ", tied " << tied << ", recompute " << int(r));
        check_one_rank(stage, tied, r);
      }
}

}  // namespace
}  // namespace lt
