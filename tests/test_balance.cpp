// Data parallelism without launching ranks: the batch split (balance.h), the ZeRO shards and the
// memory table (zero.h). Whole runs under mpirun are in tests/mpi/test_train_mpi.cpp.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "llamatrain/balance.h"
#include "llamatrain/zero.h"
#include "test_util.h"

namespace {

using lt::testing::error_of;

// ---- the split --------------------------------------------------------------------------

TEST(Balance, SplitByWeightsUsesLargestRemainders) {
  EXPECT_EQ(lt::split_by_weights(6, {1, 1}), (std::vector<int>{3, 3}));
  EXPECT_EQ(lt::split_by_weights(6, {1, 2}), (std::vector<int>{2, 4}));
  EXPECT_EQ(lt::split_by_weights(7, {1, 1, 1}), (std::vector<int>{3, 2, 2}));  // tie: lower rank
  // 10 * (0.5, 0.3, 0.2) exactly; 10 * (1/3, 1/3, 1/3) -> 3.33 each, one extra to rank 0.
  EXPECT_EQ(lt::split_by_weights(10, {5, 3, 2}), (std::vector<int>{5, 3, 2}));
  EXPECT_EQ(lt::split_by_weights(10, {1, 1, 1}), (std::vector<int>{4, 3, 3}));
  // 8 * (0.45, 0.45, 0.1) = 3.6, 3.6, 0.8: floors 3, 3, 0, leftovers to the .8 then the first .6.
  EXPECT_EQ(lt::split_by_weights(8, {0.45, 0.45, 0.1}), (std::vector<int>{4, 3, 1}));
  EXPECT_EQ(lt::split_by_weights(4, {1, 0}), (std::vector<int>{4, 0}));
  EXPECT_EQ(lt::split_by_weights(4, {100, 1}, 1), (std::vector<int>{3, 1}));  // at least one each
  for (int total : {1, 5, 12, 97})
    for (const auto& w : std::vector<std::vector<double>>{{1, 2, 3}, {0.1, 7, 0.3}, {2, 2}}) {
      const auto k = lt::split_by_weights(total, w);
      EXPECT_EQ(std::accumulate(k.begin(), k.end(), 0), total);
    }
}

TEST(Balance, RebalanceEqualisesMeasuredTimes) {
  // Rank 1 takes twice as long per micro-batch: 6 micro-batches go 4/2, step 3t -> 4t... -> 4.
  lt::Rebalance r = lt::propose_rebalance({3, 3}, {0.1, 0.2});
  EXPECT_EQ(r.split, (std::vector<int>{4, 2}));
  EXPECT_NEAR(r.predicted_now, 0.6, 1e-12);
  EXPECT_NEAR(r.predicted_new, 0.4, 1e-12);
  EXPECT_TRUE(r.take);
  // Already balanced: nothing to gain.
  r = lt::propose_rebalance({4, 2}, {0.1, 0.2});
  EXPECT_EQ(r.split, (std::vector<int>{4, 2}));
  EXPECT_FALSE(r.take);
  // A gain below 3% is not worth a change: 30 micro-batches, rank 1 2% slower.
  r = lt::propose_rebalance({15, 15}, {0.100, 0.102});
  EXPECT_FALSE(r.take) << r.predicted_now << " -> " << r.predicted_new;
  // Three ranks, speeds 1 : 2 : 4 (times 4, 2, 1): 14 micro-batches -> 2, 4, 8 (each 8 time units).
  r = lt::propose_rebalance({5, 5, 4}, {4, 2, 1});
  EXPECT_EQ(r.split, (std::vector<int>{2, 4, 8}));
  EXPECT_NEAR(r.predicted_new, 8, 1e-12);
  // Even a very slow rank keeps one micro-batch so that it stays measured.
  r = lt::propose_rebalance({2, 2}, {1.0, 100.0});
  EXPECT_EQ(r.split, (std::vector<int>{3, 1}));
}

TEST(Balance, OptionErrorsNameTheFieldAtFault) {
  EXPECT_EQ(lt::parse_rank_weights("1,2.5,0", 3), (std::vector<double>{1, 2.5, 0}));
  EXPECT_EQ(error_of([] { lt::parse_rank_weights("1,x,3", 3); }),
            "--rank-weights 1,x,3: field 2 (\"x\") is not a number >= 0");
  EXPECT_EQ(error_of([] { lt::parse_rank_weights("1,,3", 3); }),
            "--rank-weights 1,,3: field 2 (\"\") is not a number >= 0");
  EXPECT_EQ(error_of([] { lt::parse_rank_weights("1,-2", 2); }),
            "--rank-weights 1,-2: field 2 (\"-2\") is not a number >= 0");
  EXPECT_EQ(error_of([] { lt::parse_rank_weights("1,2,3", 2); }),
            "--rank-weights 1,2,3: 3 weights for 2 ranks; give one per rank");
  EXPECT_EQ(error_of([] { lt::parse_rank_weights("0,0", 2); }), "--rank-weights 0,0: all weights are 0");
  const lt::Slowdown d = lt::parse_slowdown("1=2.5", 2);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.factor, 2.5);
  EXPECT_EQ(error_of([] { lt::parse_slowdown("2=2", 2); }), "--simulate-slowdown 2=2: rank 2 is not in [0, 2)");
  EXPECT_EQ(error_of([] { lt::parse_slowdown("1=0.5", 2); }), "--simulate-slowdown 1=0.5: factor 0.5 must be >= 1");
  EXPECT_EQ(error_of([] { lt::parse_slowdown("1:2", 2); }), "--simulate-slowdown 1:2: expected RANK=FACTOR, e.g. 1=2");
  EXPECT_EQ(error_of([] { lt::parse_balance_mode("fast"); }), "--balance fast: expected off, static or auto");
}

// ---- shards and the memory table -----------------------------------------------------------

TEST(Zero, ShardsArePaddedToTheWorldSize) {
  const lt::ShardLayout s(10, 3);
  EXPECT_EQ(s.shard, 4u);
  EXPECT_EQ(s.padded, 12u);
  EXPECT_EQ(s.begin(0), 0u);
  EXPECT_EQ(s.end(0), 4u);
  EXPECT_EQ(s.begin(2), 8u);
  EXPECT_EQ(s.end(2), 10u);  // the last shard holds the 2 padding elements
  const lt::ShardLayout one(10, 1);
  EXPECT_EQ(one.padded, 10u);
  EXPECT_EQ(one.end(0), 10u);
}

// The windows the ZeRO collectives move at a time: they tile the pieces in order, each at most
// the window, with every rank's part of it (empty pieces and windows that cut pieces).
TEST(Zero, CommWindowsTileThePiecesInOrder) {
  const std::vector<size_t> pieces = {5, 0, 7, 3};
  std::vector<std::vector<size_t>> got;
  std::vector<size_t> at;
  lt::for_windows(pieces, 4, [&](size_t offset, const std::vector<size_t>& n) {
    at.push_back(offset);
    got.push_back(n);
  });
  EXPECT_EQ(at, (std::vector<size_t>{0, 4, 8, 12}));
  const std::vector<std::vector<size_t>> want = {{4, 0, 0, 0}, {1, 0, 3, 0}, {0, 0, 4, 0}, {0, 0, 0, 3}};
  EXPECT_EQ(got, want);
}

// Stages 2 and 3 hold one block's gradient scratch (and stage 3 its gathered weights) at a time:
// Llama-2-7b's widest block is a layer of 202,383,360 parameters, its embeddings 131,072,000.
TEST(Zero, BlockBytesOfStagesTwoAndThree) {
  const lt::ParameterLayout l7(lt::preset_config("llama2-7b"));
  const double layer = 202383360.0, emb = 32000.0 * 4096;
  EXPECT_EQ(double(l7.blocks[1].size()), layer);
  EXPECT_EQ(lt::zero_block_bytes(l7, 1), 0.0);
  EXPECT_EQ(lt::zero_block_bytes(l7, 2), 4 * std::max(layer, emb));
  EXPECT_EQ(lt::zero_block_bytes(l7, 3), 4 * 2 * layer);
  lt::Llama2Config tied = lt::preset_config("llama2-7b");
  tied.tied_embeddings = true;
  const lt::ParameterLayout lt7(tied);
  EXPECT_EQ(lt::zero_block_bytes(lt7, 2), 4 * (emb + layer));
  EXPECT_EQ(lt::zero_block_bytes(lt7, 3), 4 * (2 * emb + 2 * layer));
}

TEST(Zero, OptimizerStatePerRankShrinksAsOneOverN) {
  const size_t n = 6'738'415'616;  // Llama-2-7b
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 3, 16}) {
      const auto rows = lt::memory_table(n, world, stage, 1e9);
      ASSERT_EQ(rows.size(), size_t(world));
      double sum = 0;
      for (const auto& r : rows) sum += r.optimizer;
      if (stage == 0) {
        for (const auto& r : rows) EXPECT_EQ(r.optimizer, 8.0 * double(n));
      } else {
        EXPECT_EQ(sum, 8.0 * double(n)) << "the shards cover every parameter once";
        EXPECT_LE(rows[0].optimizer, 8.0 * double(n) / world + 8.0) << "stage " << stage << " world " << world;
        EXPECT_GE(rows[0].optimizer, 8.0 * double(n) / world - 8.0);
      }
      const lt::ShardLayout sl(n, world);
      EXPECT_EQ(rows[0].params, 4.0 * double(stage == 3 ? sl.end(0) - sl.begin(0) : sl.padded));
      EXPECT_EQ(rows[0].grads, 4.0 * double(stage >= 2 ? sl.end(0) - sl.begin(0) : sl.padded));
      EXPECT_EQ(rows[0].activations, 1e9);
    }
  }
  const std::string table = lt::format_memory_table(lt::memory_table(n, 2, 1, 1e9), 1);
  EXPECT_NE(table.find("ZeRO stage 1"), std::string::npos) << table;
  EXPECT_NE(table.find("  25705.02  "), std::string::npos) << table;  // 4 n bytes in MiB
  EXPECT_NE(table.find("  25705.02  "), table.rfind("  25705.02  ")) << table;
}

}  // namespace
