// Faults of device collectives end the job, never hang it (issue 15, item 8): 2 ranks on
// --device cuda-sim with a fault injected into the device communicator (LT_SIM_COMM_FAULT,
// src/backend/cuda/device_comm_sim.h). A collective that never completes reaches --comm-timeout, one
// that errors fails at once; either way the rank names itself and the collective, calls MPI_Abort,
// and the job exits with status 5 with no rank left behind. A run whose fault never strikes
// trains exactly as one without it. Every job runs under `timeout`, so a hang fails the test
// instead of stalling CTest.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llamatrain/comm_wait.h"
#include "llamatrain/builtin_qa.h"
#include "test_util.h"

namespace {

using lt::testing::run_captured;
using lt::testing::run_cli;
using lt::testing::scratch_dir;
using Clock = std::chrono::steady_clock;

constexpr int kJobLimitS = 180;  // a job still running after this has hung

struct FaultJob {
  std::filesystem::path dir = scratch_dir();
  std::string data = (dir / "qa.h5").string();
  FaultJob() {
    const std::string jsonl = (dir / "qa.jsonl").string();
    std::ofstream(jsonl) << lt::builtin_qa_jsonl(100, 11);
    const auto r = run_cli("prepare --qa '" + jsonl + "' --prompt-type 3 --vocab-size 512 --seq-len 64 --seed 1 " +
                           "--output '" + data + "'");
    EXPECT_EQ(r.status, 0) << r.err;
  }
  // `mpirun -np 2 llamatrain train` on cuda-sim for `steps` steps of 4 sequences, with `fault` in
  // LT_SIM_COMM_FAULT (none when empty) and the extra flags; bounded by kJobLimitS.
  lt::testing::CliResult train(const std::string& name, const std::string& fault, int steps,
                               const std::string& flags, double* seconds) const {
    const std::string env = fault.empty() ? "" : "env LT_SIM_COMM_FAULT=" + fault + " ";
    const std::string cmd = "timeout -k 10 " + std::to_string(kJobLimitS) + " " + env +
                            lt::testing::mpirun_llamatrain(2, 1) + "train --model-config tiny --data '" + data +
                            "' --device cuda-sim --batch-size 2 --global-batch 4 --max-steps " +
                            std::to_string(steps) + " --eval-batches 2 --seed 7 --no-progress --metrics '" +
                            (dir / (name + ".jsonl")).string() + "' " + flags;
    const auto t0 = Clock::now();
    const auto r = run_captured(cmd);
    *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("[ %s ] LT_SIM_COMM_FAULT=%s: status %d after %.1f s\n%s", name.c_str(), fault.c_str(), r.status,
                *seconds, r.err.c_str());
    return r;
  }
  std::vector<double> losses(const std::string& name) const {
    std::vector<double> l;
    std::ifstream in(dir / (name + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "step") l.push_back(j["loss"].get<double>());
    }
    return l;
  }
  // No process of this job is left (a rank waiting in a collective would be).
  void expect_no_rank_left() const {
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string cmdline = lt::testing::slurp(e.path().string() + "/cmdline");
      EXPECT_EQ(cmdline.find(data), std::string::npos) << "left running: " << e.path();
    }
  }
};

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in:\n" << text;
}

// Rank 1's first gradient bucket (the output head's, the first one backward finishes, with a
// bucket per block; all-reduced with ZeRO 0) never completes; rank 0 waits in it. --comm-timeout
// and --bucket-mb come from a config file.
TEST(CommFaults, HungCollectiveEndsTheJobAtTheTimeout) {
  const FaultJob job;
  const std::string config = (job.dir / "run.toml").string();
  std::ofstream(config) << "[train]\ncomm-timeout = 2\nbucket-mb = 0\n";
  double seconds = 0;
  const auto r = job.train("hang", "hang:allreduce:1@1", 3, "--zero 0 --config '" + config + "'", &seconds);
  EXPECT_EQ(r.status, lt::kExitCommFault);
  expect_contains(r.err, "[rank 1/2 ");
  expect_contains(r.err,
                  "llamatrain train: error: simulated NCCL allreduce (");
  expect_contains(r.err, " bytes, gradients of the final norm and output head, step 1) did not complete within 2 s "
                         "(--comm-timeout)");
  EXPECT_LT(seconds, kJobLimitS - 10) << "the job hung";
  EXPECT_TRUE(job.losses("hang").empty()) << "a step was recorded after the fault";
  job.expect_no_rank_left();
}

// Rank 0's ninth all-gather, the embedding's weights after step 2's update (the start gathers the
// working copy from the host's shards and each update gathers it again, tiny's 4 blocks one by
// one), reports an error. The rank goes on, as a GPU rank would, to its next wait for the gathers,
// in step 3 (its forward waits for the weights, then the host waits), and the job ends there at
// once: steps 1 and 2 are recorded, step 3 is not.
TEST(CommFaults, ErroringCollectiveEndsTheJobAtOnce) {
  const FaultJob job;
  double seconds = 0;
  const auto r = job.train("error", "error:allgather:9@0", 3, "--zero 1", &seconds);
  EXPECT_EQ(r.status, lt::kExitCommFault);
  expect_contains(r.err, "[rank 0/2 ");
  expect_contains(r.err, "llamatrain train: error: simulated NCCL allgather (");
  expect_contains(r.err, " bytes, bf16 weights of the embedding after the update, step 2) failed: simulated "
                         "asynchronous error (LT_SIM_COMM_FAULT=error:allgather:9@0); the communicator was aborted");
  EXPECT_EQ(job.losses("error").size(), 2u) << "found at step 3's first wait";
  EXPECT_LT(seconds, kJobLimitS - 10) << "the job hung";
  job.expect_no_rank_left();
}

// ZeRO 2 reduces each block's pieces to their owners as backward finishes the block, the output
// head first: a hang there is named with the block and the owner.
TEST(CommFaults, HungReduceNamesItsRoot) {
  const FaultJob job;
  double seconds = 0;
  const auto r = job.train("reduce", "hang:reduce:1@0", 2, "--zero 2 --comm-timeout 1", &seconds);
  EXPECT_EQ(r.status, lt::kExitCommFault);
  expect_contains(r.err, "[rank 0/2 ");
  expect_contains(r.err, "simulated NCCL reduce (");
  expect_contains(r.err, "gradients of the final norm and output head for rank ");
  expect_contains(r.err, "did not complete within 1 s");
  job.expect_no_rank_left();
}

// With the shortest timeout and a fault that never strikes, the run is the same as one without.
TEST(CommFaults, NormalRunIsUnaffected) {
  const FaultJob job;
  double plain_s = 0, armed_s = 0;
  const auto plain = job.train("plain", "", 2, "", &plain_s);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto armed = job.train("armed", "hang:any:1000000@1", 2, "--comm-timeout 1", &armed_s);
  ASSERT_EQ(armed.status, 0) << armed.err;
  const auto a = job.losses("plain"), b = job.losses("armed");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b) << "cuda-sim runs are bit-identical; the armed run differed";
}

}  // namespace
