// The parts of the training loop that need no model or ranks (src/train/train_parts.h): epoch
// counting, the checkpoint cadence, which checkpoints may continue a run, the micro-batch
// assignment and loss-token count of a step, the auto balancer's decisions, and the report text.
// Whole runs are in test_cli.cpp, test_checkpoint.cpp and mpi/test_train_mpi.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"
#include "llamatrain/hostfile.h"
#include "train/train_parts.h"

namespace lt {
namespace {

TEST(TrainSteps, EpochsAreWholeGlobalBatchesAndTheLastMayBePartial) {
  // 79 rows, global batch 8: 9 steps per epoch (7 rows skipped each pass).
  StepCounts c = count_steps(79, 8, 0, 2);
  EXPECT_EQ(c.steps_per_epoch, 9);
  EXPECT_EQ(c.total_steps, 18);
  EXPECT_EQ(c.n_epochs, 2);
  EXPECT_EQ(c.epoch_of(0), 0);
  EXPECT_EQ(c.epoch_of(8), 0);
  EXPECT_EQ(c.epoch_of(9), 1);
  // --max-steps wins over --epochs and may end inside an epoch.
  c = count_steps(79, 8, 20, 1);
  EXPECT_EQ(c.total_steps, 20);
  EXPECT_EQ(c.n_epochs, 3);
  c = count_steps(79, 8, 5, 1);
  EXPECT_EQ(c.n_epochs, 1);
  c = count_steps(8, 8, 0, 3);  // exactly one step per epoch
  EXPECT_EQ(c.steps_per_epoch, 1);
  EXPECT_EQ(c.total_steps, 3);
  EXPECT_EQ(c.n_epochs, 3);
}

std::vector<int64_t> due_steps(const StepCounts& c, int64_t every) {
  std::vector<int64_t> v;
  for (int64_t done = 1; done <= c.total_steps; ++done)
    if (checkpoint_due(done, c, every, false)) v.push_back(done);
  return v;
}

TEST(TrainCheckpointCadence, EpochEndsRunEndEveryNAndStopSignals) {
  const StepCounts c = count_steps(79, 8, 20, 1);  // 9 per epoch, 20 in all
  EXPECT_EQ(due_steps(c, 0), (std::vector<int64_t>{9, 18, 20}));
  EXPECT_EQ(due_steps(c, 4), (std::vector<int64_t>{4, 8, 9, 12, 16, 18, 20}));
  EXPECT_EQ(due_steps(c, 100), (std::vector<int64_t>{9, 18, 20}));
  for (int64_t done = 1; done <= c.total_steps; ++done) EXPECT_TRUE(checkpoint_due(done, c, 0, true)) << done;
}

// A checkpoint that failed is tried again at the next one due: next_checkpoint_step agrees with
// checkpoint_due for every step, and is -1 after the last.
TEST(TrainCheckpointCadence, NextCheckpointIsTheNextDueStep) {
  const StepCounts c = count_steps(79, 8, 20, 1);  // 9 per epoch, 20 in all
  for (int64_t every : {0, 4, 100}) {
    const std::vector<int64_t> due = due_steps(c, every);
    for (int64_t done = 0; done < c.total_steps; ++done) {
      const int64_t want = *std::upper_bound(due.begin(), due.end(), done);
      EXPECT_EQ(next_checkpoint_step(done, c, every), want) << "every " << every << ", after step " << done;
    }
    EXPECT_EQ(next_checkpoint_step(c.total_steps, c, every), -1);
  }
}

TEST(TrainResume, CheckpointMismatchNamesWhatDiffers) {
  RunIdentity run{"dim=64", "abcdef0123456789", "data-1", 8};
  CheckpointInfo ci;
  ci.model_config = run.model_config;
  ci.tokenizer_sha256 = run.tokenizer_sha256;
  ci.data_identity = run.data_identity;
  ci.global_batch = run.global_batch;
  EXPECT_EQ(checkpoint_mismatch(ci, "ck/step-1", run, false), "");
  CheckpointInfo other = ci;
  other.model_config = "dim=128";
  EXPECT_NE(checkpoint_mismatch(other, "ck/step-1", run, false).find("ck/step-1: a checkpoint of another model (dim=128)"),
            std::string::npos);
  other = ci;
  other.tokenizer_sha256 = "ffffffffffffffff";
  EXPECT_NE(checkpoint_mismatch(other, "p", run, false).find("another tokenizer"), std::string::npos);
  other = ci;
  other.data_identity = "data-2";
  EXPECT_NE(checkpoint_mismatch(other, "p", run, false).find("--allow-new-data"), std::string::npos);
  EXPECT_EQ(checkpoint_mismatch(other, "p", run, true), "");
  other = ci;
  other.global_batch = 16;
  EXPECT_NE(checkpoint_mismatch(other, "p", run, true).find("global batch of 16 sequences; this run has 8"),
            std::string::npos);
}

TEST(TrainResume, ScheduleChangeSaysWhereTheDecayNowEnds) {
  const LrSchedule before{1e-3f, 1e-4f, 2, 18};
  EXPECT_EQ(schedule_change(before, before, 10), "");
  EXPECT_EQ(schedule_change(LrSchedule{0, 0, 0, 0}, before, 10), "");  // not recorded: nothing to compare
  const LrSchedule longer{1e-3f, 1e-4f, 2, 27};
  const std::string s = schedule_change(before, longer, 18);
  EXPECT_NE(s.find("the learning-rate schedule changes at step 18: 18 -> 27 total steps"), std::string::npos) << s;
  EXPECT_NE(s.find("now ends at step 27 instead of 18"), std::string::npos) << s;
  // Step 19 under the old schedule is past its end (min lr); under the new one, part-way down.
  char want[64];
  std::snprintf(want, sizeof want, "lr of step 19 %.4g (was %.4g)", double(longer.at(18)), 1e-4);
  EXPECT_NE(s.find(want), std::string::npos) << s << " / " << want;
  const std::string w = schedule_change(before, LrSchedule{1e-3f, 1e-4f, 4, 18}, 3);
  EXPECT_NE(w.find("18 total steps as before; warm-up 2 -> 4 steps"), std::string::npos) << w;
}

TEST(TrainStep, RanksTakeContiguousMicroBatchesAndTokensCountTheGlobalBatch) {
  EXPECT_EQ(first_micro_batch({3, 1, 2}, 0), 0);
  EXPECT_EQ(first_micro_batch({3, 1, 2}, 1), 3);
  EXPECT_EQ(first_micro_batch({3, 1, 2}, 2), 4);
  // 4 rows of T=3 (+1 token); row i has i+1 loss tokens among targets 1..3 (column 0 is never a
  // target, so its mask is ignored).
  TokenSplit split;
  split.n_seq = 4;
  split.seq_len = 3;
  split.tokens.assign(16, 1);
  split.loss_mask = {1, 1, 0, 0,  //
                     1, 1, 1, 0,  //
                     1, 1, 1, 1,  //
                     1, 1, 1, 1};
  DataOrder order(4, 7, /*shuffle=*/false);
  EXPECT_EQ(count_loss_tokens(split, order, 0, 0, 4, 3), 1 + 2 + 3 + 3);
  EXPECT_EQ(count_loss_tokens(split, order, 0, 1, 2, 3), 2 + 3);
  // Shuffled, a whole epoch still counts every row once.
  DataOrder shuffled(4, 7, true);
  EXPECT_EQ(count_loss_tokens(split, shuffled, 1, 0, 4, 3), 9);
}

TEST(TrainBalance, AutoDecidesAfterFiveStepsThenEveryNFromMedians) {
  AutoBalancer bal(2, 3);
  const std::vector<int> split{4, 4};
  // Rank 1 takes 3x as long per micro-batch; step 0 (cold) is a wild outlier and is not measured.
  std::vector<int64_t> decided;
  std::vector<int> last_split;
  for (int64_t step = 0; step < 11; ++step) {
    const std::vector<double> compute = step == 0 ? std::vector<double>{100, 0.4} : std::vector<double>{0.4, 1.2};
    if (const auto d = bal.observe(step, compute, split)) {
      decided.push_back(step + 1);
      EXPECT_NEAR(d->seconds_per_micro_batch[0], 0.1, 1e-12);
      EXPECT_NEAR(d->seconds_per_micro_batch[1], 0.3, 1e-12);
      EXPECT_TRUE(d->rebalance.take);
      last_split = d->rebalance.split;
    }
  }
  EXPECT_EQ(decided, (std::vector<int64_t>{5, 8, 11}));
  EXPECT_EQ(last_split, (std::vector<int>{6, 2}));
}

TEST(TrainReport, ProgressTextAndEta) {
  EXPECT_EQ(format_eta(59.4), "00:59");
  EXPECT_EQ(format_eta(3725), "1:02:05");
  EXPECT_EQ(format_eta(NAN), "--:--");
  StepTimes t;
  t.compute = {0.010, 0.030};
  t.slowest = 1;
  t.balance = 0.67;
  EXPECT_EQ(progress_text(2.5, NAN, 1234.4, t, 1, 1, 10), "loss 2.5000 1234 tok/s");
  EXPECT_EQ(progress_text(2.5, NAN, 1234.4, t, 2, 3, 10),
            "loss 2.5000 1234 tok/s slowest r1 30 ms balance 0.67 run eta 00:10");
  // --eval-every: the latest test loss follows the train loss.
  EXPECT_EQ(progress_text(2.5, 2.75, 1234.4, t, 1, 1, 10), "loss 2.5000 test 2.7500 1234 tok/s");
  EXPECT_EQ(join({1, 2, 3}), "1,2,3");
}

// The progress line's loss is the mean per loss token over the last 10 steps (weighted by tokens,
// so a step with few loss tokens counts little); the run's last line compares the means of its
// first and last 10 steps, or halves of a shorter run; the ETA is at the rate of the steps this
// run did.
TEST(TrainReport, RunLossesAndRunEta) {
  RunLosses w;
  EXPECT_TRUE(std::isnan(w.recent()));
  EXPECT_EQ(w.ends().steps, 0);
  w.add(30.0, 10);  // mean 3
  w.add(10.0, 10);  // mean 1
  EXPECT_DOUBLE_EQ(w.recent(), 2.0);
  w.add(0.0, 0);    // no loss tokens: changes nothing
  EXPECT_DOUBLE_EQ(w.recent(), 2.0);
  for (size_t i = 0; i < RunLosses::kWindow; ++i) w.add(5.0 * 4, 4);  // ten steps of mean 5 push the others out
  EXPECT_DOUBLE_EQ(w.recent(), 5.0);
  w.add(16.0 * 36, 36);  // one step of mean 16 and 36 tokens beside nine of mean 5 and 4 tokens
  EXPECT_DOUBLE_EQ(w.recent(), (16.0 * 36 + 9 * 20.0) / (36 + 9 * 4));

  RunLosses run;
  for (int i = 0; i < 25; ++i) run.add(2.0 * (25 - i), 2);  // step i's mean: 25 - i
  const LossEnds e25 = run.ends();
  EXPECT_EQ(e25.steps, 10);
  EXPECT_DOUBLE_EQ(e25.first, 20.5);  // means 25..16
  EXPECT_DOUBLE_EQ(e25.last, 5.5);    // means 10..1
  RunLosses five;
  for (int i = 0; i < 5; ++i) five.add(2.0 * (25 - i), 2);
  const LossEnds e5 = five.ends();
  EXPECT_EQ(e5.steps, 2);
  EXPECT_DOUBLE_EQ(e5.first, 24.5);
  EXPECT_DOUBLE_EQ(e5.last, 21.5);  // steps 3 and 4 (means 22, 21)
  RunLosses one;
  one.add(3.0, 1);
  EXPECT_EQ(one.ends().steps, 1);
  EXPECT_DOUBLE_EQ(one.ends().first, one.ends().last);
  // A run resumed at step 60 of 134 that has done 10 steps in 100 s: 64 left at 10 s each.
  EXPECT_DOUBLE_EQ(run_eta_s(100.0, 10, 64), 640.0);
  EXPECT_TRUE(std::isnan(run_eta_s(0.0, 0, 64)));
}

// MFU's denominator: a dense peak that a run cannot beat. The CPU's is threads x clock x FLOPs per
// cycle of its widest FMA; a GPU's comes from the datasheet table by the name CUDA reports.
TEST(TrainMfu, PeaksFromCpuinfoAndTheGpuTable) {
  const std::string avx512 = "processor\t: 0\ncpu MHz\t\t: 2100.000\nflags\t\t: fpu sse2 avx2 fma avx512f\n"
                             "processor\t: 1\ncpu MHz\t\t: 3000.000\nflags\t\t: fpu sse2 avx2 fma avx512f\n";
  std::string what;
  EXPECT_NEAR(cpu_peak_tflops(avx512, 2, &what), 2 * 3.0e9 * 64 / 1e12, 1e-12);
  EXPECT_NE(what.find("AVX-512"), std::string::npos) << what;
  EXPECT_NEAR(cpu_peak_tflops("cpu MHz\t: 2000\nflags\t: sse2 avx2 fma\n", 4, nullptr), 4 * 2.0e9 * 32 / 1e12, 1e-12);
  EXPECT_NEAR(cpu_peak_tflops("cpu MHz\t: 2000\nflags\t: sse2 avx\n", 1, nullptr), 2.0e9 * 16 / 1e12, 1e-12);
  EXPECT_EQ(cpu_peak_tflops("flags\t: avx2\n", 8, nullptr), 0.0);  // no clock listed
  const double gib80 = 80.0 * (1ull << 30), gib40 = 40.0 * (1ull << 30);
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H100 80GB HBM3", gib80)->name, "H100-SXM5-80GB");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H100 PCIe", gib80)->name, "H100-PCIe-80GB");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H100 NVL", 94.0 * (1ull << 30))->name, "H100-NVL-94GB");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H200", 141.0 * (1ull << 30))->name, "H200");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA A100-SXM4-40GB", gib40)->name, "A100-SXM4-40GB");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA A100 80GB PCIe", gib80)->name, "A100-PCIe-80GB");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA A100-PCIE-40GB", gib40)->name, "A100-PCIe-40GB");
  EXPECT_EQ(gpu_spec_for_device("NVIDIA H200", 0)->bf16_tflops, 989);
  EXPECT_EQ(gpu_spec_for_device("NVIDIA GeForce RTX 4090", 24.0 * (1ull << 30)), nullptr);
}

}  // namespace
}  // namespace lt
