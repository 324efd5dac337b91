// A training step on the CUDA backend without host stalls (DESIGN.md, "Distributed training"):
// after the first step, no device allocation, free or device-wide synchronisation, one upload of
// the batch and one of the embedding plan per micro-batch, the loss read once, and no cuBLASLt plan
// built. Checked on --device cuda-sim, whose device runtime counts the same calls as the GPU one
// (src/backend/cuda/device_counters.h), from the `device_calls` of train's step records, under
// `mpirun -np 2` with ZeRO 0, 1 and 2 and several micro-batches per rank.
#include <fstream>
#include <nlohmann/json.hpp>

#include "llamatrain/builtin_qa.h"
#include "test_util.h"

namespace {

using lt::testing::run_cli;
using lt::testing::run_mpi;
using lt::testing::scratch_dir;

std::vector<nlohmann::json> step_records(const std::filesystem::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") out.push_back(j);
  }
  return out;
}

// Steps 2.. of a run: the first step allocates the activations, the staging and the optimizer's
// scratch and builds the cuBLASLt plans; every later one only reuses them.
// sim_block_waits: the simulator's waits per step for ZeRO 2's block reductions (below).
void expect_steady_steps(const std::vector<nlohmann::json>& steps, int ranks, int micro_batches_per_rank,
                         int sim_block_waits, const std::string& what) {
  ASSERT_GE(steps.size(), 3u) << what;
  const auto& first = steps[0]["device_calls"];
  for (int r = 0; r < ranks; ++r) {
    // The counts count: the first step allocates and builds its plans.
    EXPECT_GT(first["allocs"][r].get<int64_t>(), 0) << what << " rank " << r << ": step 1 allocated nothing?";
    EXPECT_GT(first["plans_built"][r].get<int64_t>(), 0) << what << " rank " << r;
  }
  for (size_t s = 1; s < steps.size(); ++s) {
    const auto& c = steps[s]["device_calls"];
    std::printf("%s, step %zu: %s\n", what.c_str(), s + 1, c.dump().c_str());
    for (int r = 0; r < ranks; ++r) {
      const std::string at = what + ", step " + std::to_string(s + 1) + ", rank " + std::to_string(r);
      EXPECT_EQ(c["allocs"][r].get<int64_t>(), 0) << at;
      EXPECT_EQ(c["frees"][r].get<int64_t>(), 0) << at;
      EXPECT_EQ(c["device_syncs"][r].get<int64_t>(), 0) << at;
      EXPECT_EQ(c["plans_built"][r].get<int64_t>(), 0) << at;
      // Per micro-batch: the packed batch and the embedding backward's plan, both asynchronous.
      EXPECT_EQ(c["h2d_copies"][r].get<int64_t>(), 2 * micro_batches_per_rank) << at;
      // Per step: the squared gradient norm and the micro-batches' losses, read once each.
      EXPECT_EQ(c["d2h_copies"][r].get<int64_t>(), 2) << at;
      EXPECT_EQ(c["blocking_copies"][r].get<int64_t>(), 2) << at;
      // Waits for a staging slot's copy of two micro-batches back (batch and embedding plan), for
      // the compute stream at the end of the micro-batches, and for the collectives: the
      // gradients', and (ZeRO 1/2) the weight gathers, which the next forward's waits settle, and
      // ZeRO 2's reduction of each block every micro-batch (settled at the host's waits).
      EXPECT_LE(c["stream_syncs"][r].get<int64_t>(), 2 * micro_batches_per_rank + 3 + sim_block_waits) << at;
    }
  }
}

TEST(CudaSimStalls, SteadyStepsNeitherAllocateNorSynchronise) {
  const auto dir = scratch_dir();
  const std::string jsonl = (dir / "qa.jsonl").string(), data = (dir / "qa.h5").string();
  std::ofstream(jsonl) << lt::builtin_qa_jsonl(200, 11);
  const auto prep = run_cli("prepare --qa '" + jsonl + "' --prompt-type 3 --vocab-size 512 --seq-len 64 " +
                            "--test-split 0.1 --seed 1 --output '" + data + "'");
  ASSERT_EQ(prep.status, 0) << prep.err;
  std::printf("seed 7, 3 steps of 12 sequences on 2 ranks: 3 micro-batches of 2 per rank\n");
  for (int zero : {0, 1, 2}) {
    const std::string name = "zero" + std::to_string(zero);
    const auto r = run_mpi(2, "train --model-config tiny --data '" + data +
                                  "' --device cuda-sim --batch-size 2 --global-batch 12 --max-steps 3 --lr 3e-3 "
                                  "--warmup-steps 2 --eval-batches 2 --seed 7 --no-progress --balance off --zero " +
                                  std::to_string(zero) + " --metrics '" + (dir / (name + ".jsonl")).string() +
                                  "' --output '" + (dir / name).string() + "'");
    ASSERT_EQ(r.status, 0) << r.err;
    const int blocks = 4;  // tiny: the embedding, 2 layers, the head
    expect_steady_steps(step_records(dir / (name + ".jsonl")), 2, 3, zero == 2 ? 3 * blocks : 0,
                        "ZeRO " + std::to_string(zero));
  }
}

}  // namespace
