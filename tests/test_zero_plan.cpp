// The ZeRO plan (include/llamatrain/zero_plan.h): the collectives one step issues, derived from the
// pass's block calls and the stage, in order; and the trace that train --trace-collectives writes.
// tests/mpi/test_zero_plan_mpi.cpp checks the engines against it under mpirun.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "llamatrain/comm.h"
#include "llamatrain/zero_blocks.h"
#include "llamatrain/zero_plan.h"
#include "test_util.h"
#include "zero_trace.h"

namespace lt {
namespace {

Llama2Config two_layers(bool tied) {
  Llama2Config c = preset_config("tiny");
  c.dim = 16, c.hidden_dim = 24, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.vocab_size = 21;
  c.max_seq_len = 8, c.tied_embeddings = tied;
  return c;
}

// "G1" = all-gather of block 1, "R3" = its reduce-scatter, "A0" = an all-reduce starting at block
// 0, "N" = the norm's sum: the plan's calls in short, for lists written out by hand.
std::string shorthand(const std::vector<ZeroCall>& calls, const ParameterLayout& L) {
  std::string out;
  for (const ZeroCall& c : calls) {
    int b = 0;
    while (b + 1 < int(L.blocks.size()) && L.blocks[size_t(b + 1)].begin <= c.begin) ++b;
    const char* op = c.op == ZeroOp::kAllGather ? "G" : c.op == ZeroOp::kReduceScatter ? "R" : c.op == ZeroOp::kAllReduce ? "A" : "N";
    out += (out.empty() ? "" : " ") + std::string(op) + (c.op == ZeroOp::kNormSum ? "" : std::to_string(b));
  }
  return out;
}

// Stage 3 on 2 ranks: each block gathered before its first use in the forward and again in the
// backward (released in between), each block's gradients reduce-scattered as the backward finishes
// it, the embeddings' last (no weights needed for their backward when untied). With prefetch the
// next block's gather moves ahead of the current block's reduction.
TEST(ZeroPlan, Stage3RoundGathersBeforeUseAndReducesAsTheBackwardFinishes) {
  const ParameterLayout untied(two_layers(false)), tied(two_layers(true));
  ZeroPlanOptions o;
  EXPECT_EQ(shorthand(ZeroPlan(untied, 2, 3, o).round_calls(), untied), "G0 G1 G2 G3 G3 R3 G2 R2 G1 R1 R0");
  EXPECT_EQ(shorthand(ZeroPlan(tied, 2, 3, o).round_calls(), tied), "G0 G1 G2 G3 G3 G0 R3 G2 R2 G1 R1 R0");
  o.prefetch = true;
  EXPECT_EQ(shorthand(ZeroPlan(untied, 2, 3, o).round_calls(), untied), "G0 G1 G2 G3 G3 G2 R3 G1 R2 R1 R0");
  EXPECT_EQ(shorthand(ZeroPlan(untied, 2, 3, o).forward_calls(), untied), "G0 G1 G2 G3");
  o.frozen = true;  // LoRA's base: the gathers alone, and no update
  EXPECT_EQ(shorthand(ZeroPlan(untied, 2, 3, o).round_calls(), untied), "G0 G1 G2 G3 G3 G2 G1");
  EXPECT_TRUE(ZeroPlan(untied, 2, 3, o).update_calls().empty());
}

// A step: the rounds' calls `rounds` times, then the update's: stage 0 all-reduces each bucket
// from the top, stage 1 reduce-scatters them, sums the norm and gathers every block in forward
// order, stage 2 sums the norm and gathers, stage 3 sums the norm. One rank issues nothing.
TEST(ZeroPlan, AStepIsItsRoundsThenTheUpdate) {
  const ParameterLayout L(two_layers(false));
  ZeroPlanOptions per_block;
  per_block.bucket_bytes = 0;
  EXPECT_EQ(shorthand(ZeroPlan(L, 3, 0, per_block).step_calls(2), L), "A3 A2 A1 A0");
  EXPECT_EQ(shorthand(ZeroPlan(L, 3, 1, per_block).step_calls(2), L), "R3 R2 R1 R0 N G0 G1 G2 G3");
  EXPECT_EQ(shorthand(ZeroPlan(L, 3, 1).step_calls(1), L), "R0 N G0 G1 G2 G3");  // one 25 MiB bucket
  EXPECT_EQ(shorthand(ZeroPlan(L, 2, 2).step_calls(2), L), "R3 R2 R1 R0 R3 R2 R1 R0 N G0 G1 G2 G3");
  EXPECT_EQ(shorthand(ZeroPlan(L, 4, 3).step_calls(1), L), "G0 G1 G2 G3 G3 R3 G2 R2 G1 R1 R0 N");
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_TRUE(ZeroPlan(L, 1, stage).step_calls(3).empty()) << "stage " << stage;
    for (int world = 2; world <= 4; ++world) {
      const ZeroPlan p(L, world, stage, per_block);
      const std::vector<ZeroCall> round = p.round_calls(), update = p.update_calls(), step = p.step_calls(3);
      ASSERT_EQ(step.size(), 3 * round.size() + update.size()) << "stage " << stage << ", " << world << " ranks";
      EXPECT_TRUE(std::equal(update.begin(), update.end(), step.end() - long(update.size())));
      // Every round's reductions cover each block once; the buckets tile [0, padded).
      size_t reduced = 0;
      for (const ZeroCall& c : stage >= 2 ? round : update)
        if (c.op != ZeroOp::kAllGather && c.op != ZeroOp::kNormSum) reduced += c.end - c.begin;
      EXPECT_EQ(reduced, stage >= 2 ? L.total() : p.shards().padded) << "stage " << stage << ", " << world << " ranks";
    }
  }
}

// LoRA's adapters: a flat table is one block and one bucket, stages 0 and 1.
TEST(ZeroPlan, AFlatTableIsOneBlockAndOneBucket) {
  const ZeroPlan p(1001, 3, 1);
  ASSERT_EQ(p.step_calls(2).size(), 3u);
  EXPECT_EQ(p.step_calls(2)[0].text(), "reduce-scatter [0, 1002)");
  EXPECT_EQ(p.step_calls(2)[1].text(), "norm-sum");
  EXPECT_EQ(p.step_calls(2)[2].text(), "all-gather [0, 1001)");
  EXPECT_THROW(ZeroPlan(1001, 3, 2), Error);
}

// The trace: a HostZeroComm's calls and the trainer's notes written by one process and read back
// in sections; a damaged line names the file and line.
TEST(ZeroTrace, CallsAndNotesReadBackInSections) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::string path = (dir / "trace.0").string();
  std::unique_ptr<Comm> self = make_self_comm();
  const ShardLayout shards(10, 1);
  HostZeroComm zc(*self, shards, DType::kF32);
  std::vector<float> buf(10, 1.f);
  zc.reduce(ZeroOp::kAllReduce, 0, 4, buf.data(), "gradients");  // before the trace: not written
  start_zero_trace(path);
  zc.reduce(ZeroOp::kReduceScatter, 4, 10, buf.data() + 4, "gradients");
  zero_trace_note("step 1 rounds 2");
  zc.gather(0, 10, buf.data(), "weights");
  EXPECT_EQ(zc.norm_sum(2.5), 2.5);
  stop_zero_trace();
  zc.gather(0, 10, buf.data(), "weights");  // after: not written
  const std::vector<testing::ZeroTraceSection> s = testing::read_zero_trace(path);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].note, "");
  ASSERT_EQ(s[0].calls.size(), 1u);
  EXPECT_EQ(s[0].calls[0], (ZeroCall{ZeroOp::kReduceScatter, 4, 10}));
  EXPECT_EQ(s[1].note, "step 1 rounds 2");
  ASSERT_EQ(s[1].calls.size(), 2u);
  EXPECT_EQ(s[1].calls[0].text(), "all-gather [0, 10)");
  EXPECT_EQ(s[1].calls[1].text(), "norm-sum");
  std::ofstream(path, std::ios::app) << "all-scatter 1 2\n";
  try {
    testing::read_zero_trace(path);
    ADD_FAILURE() << "a damaged trace was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trace.0:5: expected \"<op> <begin> <end>\", got \"all-scatter 1 2\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lt
