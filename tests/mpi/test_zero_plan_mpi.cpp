// ZeRO planned once (include/llamatrain/zero_plan.h): whole training runs under `mpirun -np 1-4`
// on the CPU engine and on the CUDA engine (cuda-sim), ZeRO stages 0-3, with the batch split
// unevenly (one rank more micro-batches than another) and with a rank idle for the whole step,
// each rank tracing the collectives its engine issued (train --trace-collectives). Every step's
// trace must be exactly the plan's list for that stage, rank count and number of rounds, in the
// plan's order, on every rank: the engines' agreement is checked here, not assumed.
#include <cmath>
#include <filesystem>
#include <string>

#include "llamatrain/lora.h"
#include "llamatrain/model.h"
#include "llamatrain/zero_plan.h"
#include "test_util.h"
#include "zero_trace.h"

namespace {

using lt::testing::run_cli;
using lt::testing::run_mpi;
using lt::testing::scratch_dir;

struct TraceCase {
  int np, stage, global_batch;
  const char* device;  // "cpu" or "cuda-sim"
  int lora_rank = 0;   // LoRA: the frozen base's plan (stage 3: its gathers) and the adapters'
};

// What a step issues: the model's plan, or with LoRA the frozen base's rounds (its gathers at stage
// 3, none below) followed by the update of the adapters' flat table at stage min(stage, 1).
std::vector<lt::ZeroCall> planned_step(const TraceCase& c, const lt::ParameterLayout& layout, bool prefetch,
                                       int rounds) {
  lt::ZeroPlanOptions options;
  options.bucket_bytes = 0;
  options.prefetch = prefetch;
  if (c.lora_rank == 0) return lt::ZeroPlan(layout, c.np, c.stage, options).step_calls(rounds);
  std::vector<lt::ZeroCall> out;
  if (c.stage == 3) {
    options.frozen = true;
    out = lt::ZeroPlan(layout, c.np, 3, options).step_calls(rounds);
  }
  lt::LoraConfig lc;
  lc.rank = c.lora_rank;
  const std::vector<lt::ZeroCall> update =
      lt::ZeroPlan(lt::LoraLayout(lt::preset_config("tiny"), lc).total(), c.np, std::min(c.stage, 1)).update_calls();
  out.insert(out.end(), update.begin(), update.end());
  return out;
}

std::string prepare(const std::filesystem::path& dir) {
  const std::string data = (dir / "tales.h5").string();
  const auto r = run_cli("prepare --text builtin:tinytales --vocab-size 512 --seq-len 32 --seed 1 --output '" + data + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  return data;
}

// Two steps of `global_batch` sequences, one per micro-batch, per-block gradient buckets
// (--bucket-mb 0: several buckets, reduced from the top), the device's default ZeRO 3 prefetch.
void check_trace(const std::filesystem::path& dir, const std::string& data, const TraceCase& c) {
  const std::string name = lt::strcat(c.device, "-np", c.np, "-zero", c.stage, "-gb", c.global_batch,
                                     c.lora_rank ? lt::strcat("-lora", c.lora_rank) : std::string());
  const std::string trace = (dir / name).string();
  const auto r = run_mpi(c.np,
                         lt::strcat("train --model-config tiny --data '", data, "' --device ", c.device,
                                    " --batch-size 1 --global-batch ", c.global_batch, " --max-steps 2 --zero ",
                                    c.stage, " --bucket-mb 0 --seed 3 --no-progress --trace-collectives '",
                                    trace, "'", c.lora_rank ? lt::strcat(" --lora-rank ", c.lora_rank) : std::string()),
                         1);
  ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
  const lt::ParameterLayout layout(lt::preset_config("tiny"));
  // Even balance: the ranks' micro-batches differ by one at most, so the rounds are the ceiling.
  const int rounds = (c.global_batch + c.np - 1) / c.np;
  for (int rank = 0; rank < c.np; ++rank) {
    int steps = 0;
    for (const lt::testing::ZeroTraceSection& s : lt::testing::read_zero_trace(lt::strcat(trace, ".", rank))) {
      if (s.note.rfind("step ", 0) != 0) continue;
      ++steps;
      EXPECT_EQ(s.note, lt::strcat("step ", steps, " rounds ", rounds)) << name << ", rank " << rank;
      const std::vector<lt::ZeroCall> want = planned_step(c, layout, std::string(c.device) != "cpu", rounds);
      size_t i = 0;
      while (i < want.size() && i < s.calls.size() && want[i] == s.calls[i]) ++i;
      if (i < want.size() || i < s.calls.size())
        ADD_FAILURE() << name << ", rank " << rank << ", " << s.note << ": call " << i << " of " << s.calls.size()
                      << " issued is " << (i < s.calls.size() ? s.calls[i].text() : std::string("missing"))
                      << ", the plan's (" << want.size() << ") is "
                      << (i < want.size() ? want[i].text() : std::string("none"));
      if (rank == 0 && steps == 1)
        std::printf("[ %s ] %zu collectives a step, as planned: %s\n", name.c_str(), s.calls.size(),
                    i == want.size() && i == s.calls.size() ? "yes" : "NO");
    }
    EXPECT_EQ(steps, 2) << name << ", rank " << rank;
  }
}

void check_engine(const char* device) {
  const std::filesystem::path dir = scratch_dir();
  const std::string data = prepare(dir);
  std::printf("tiny, seed 3, 2 steps, one sequence per micro-batch, --bucket-mb 0, device %s\n", device);
  for (int np = 1; np <= 4; ++np)
    for (int stage = 0; stage <= 3; ++stage) {
      // Uneven: one more micro-batch than ranks (rank 0 has two, the others one).
      check_trace(dir, data, {np, stage, np + 1, device});
      // Idle: one fewer than ranks, so the last rank has none and joins every round idle.
      if (np >= 3 && stage >= 2) check_trace(dir, data, {np, stage, np - 1, device});
    }
}

TEST(ZeroPlanOrder, CpuEngineIssuesThePlansCollectives) { check_engine("cpu"); }
TEST(ZeroPlanOrder, CudaSimEngineIssuesThePlansCollectives) { check_engine("cuda-sim"); }

// LoRA (rank 4 on every product) on 3 ranks, 4 micro-batches (2, 1, 1): the frozen base's gathers
// at stage 3 and the adapters' reduction, norm and gather, on both engines.
TEST(ZeroPlanOrder, LoraRunsIssueThePlansCollectives) {
  const std::filesystem::path dir = scratch_dir();
  const std::string data = prepare(dir);
  for (const char* device : {"cpu", "cuda-sim"})
    for (int stage = 0; stage <= 3; ++stage) check_trace(dir, data, {3, stage, 4, device, 4});
}

}  // namespace
