// Whole training runs under `mpirun -np 1|2|3`, compared with one process on the same global
// batch; balancing, errors and a killed rank. CTest runs these one at a time (RUN_SERIAL): ranks
// waiting in a collective poll, and two oversubscribed jobs at once would mostly measure that.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "llamatrain/builtin_qa.h"
#include "llamatrain/checkpoint.h"
#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/loader.h"
#include "llamatrain/model_io.h"
#include "llamatrain/zero.h"
#include "test_util.h"

namespace {

using lt::testing::run_cli;
using lt::testing::run_mpi;
using lt::testing::scratch_dir;

// ---- whole runs under mpirun ---------------------------------------------------------------

// The built-in records with each answer cut to its evidence (the sentence before " The question
// asks about the ...", as the generator wrote them before issue 38): the rows and tolerances these
// tests were measured with.
std::string evidence_only_records(int n, uint64_t seed) {
  std::istringstream in(lt::builtin_qa_jsonl(n, seed));
  std::string out;
  for (std::string line; std::getline(in, line);) {
    auto rec = nlohmann::ordered_json::parse(line);
    std::string answer = rec["answer"];
    rec["answer"] = answer.substr(0, answer.find(" The question asks about the "));
    out += rec.dump() + "\n";
  }
  return out;
}

// A small question/answer dataset: packed rows whose loss-token counts differ, so a split of the
// batch that averaged per rank would weight tokens differently from one process.
struct Job {
  std::filesystem::path dir;
  std::string data;
  explicit Job(const std::filesystem::path& d) : dir(d), data((d / "qa.h5").string()) {
    const std::string jsonl = (d / "qa.jsonl").string();
    std::ofstream(jsonl) << evidence_only_records(400, 11);
    const auto r = run_cli("prepare --qa '" + jsonl + "' --prompt-type 3 --vocab-size 512 --seq-len 64 " +
                           "--test-split 0.1 --seed 1 --output '" + data + "'");
    EXPECT_EQ(r.status, 0) << r.err;
  }
  // Flags of every run: 6 micro-batches of 2 per step unless told otherwise; the test loss at the end
  // over 4 micro-batches of the test split (a tenth of a 2-step cuda-sim run's time, where the whole
  // split's 20 took a third; with 3 ranks one of them still idles through the last round).
  std::string train_args(const std::string& name, int steps, int global_batch = 12) const {
    return "train --model-config tiny --data '" + data + "' --batch-size 2 --global-batch " +
           std::to_string(global_batch) + " --max-steps " + std::to_string(steps) +
           " --eval-batches 4 --lr 3e-3 --warmup-steps 2 --seed 7 --no-progress --metrics '" +
           (dir / (name + ".jsonl")).string() + "' --output '" + (dir / name).string() + "'";
  }
  std::vector<nlohmann::json> metrics(const std::string& name, const std::string& type) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir / (name + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == type) out.push_back(j);
    }
    return out;
  }
  std::vector<double> losses(const std::string& name) const {
    std::vector<double> l;
    for (const auto& j : metrics(name, "step")) l.push_back(j["loss"].get<double>());
    return l;
  }
  std::vector<float> weights(const std::string& name) const {
    return lt::load_model((dir / name / "model.h5").string()).params;
  }
};

// Losses per step within 1e-5 relative; each final weight tensor within 1e-5 relative in L2 norm
// (||a - b|| / ||a||). fp32 sums taken in another order differ in the last bits and Adam carries
// that on, so single elements drift further: the worst element, relative to its tensor's largest
// magnitude, is reported and held to 1e-4.
void expect_same_weights(const Job& job, const std::string& ref, const std::string& run) {
  const auto wa = job.weights(ref), wb = job.weights(run);
  ASSERT_EQ(wa.size(), wb.size());
  const lt::ParameterLayout layout(lt::preset_config("tiny"));
  double worst = 0, worst_norm = 0;
  std::string worst_at, worst_tensor;
  for (const auto& t : layout.tensors()) {
    float scale = 0;
    double diff2 = 0, ref2 = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      scale = std::max(scale, std::abs(wa[i]));
      diff2 += (double(wa[i]) - double(wb[i])) * (double(wa[i]) - double(wb[i]));
      ref2 += double(wa[i]) * double(wa[i]);
    }
    const double norm_rel = std::sqrt(diff2 / ref2);
    if (norm_rel > worst_norm) worst_norm = norm_rel, worst_tensor = t.name;
    EXPECT_LT(norm_rel, 1e-5) << run << ": " << t.name;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double rel = std::abs(double(wa[i]) - double(wb[i])) / double(scale);
      if (rel > worst) worst = rel, worst_at = lt::strcat(t.name, "[", i - t.offset, "]: ", wa[i], " vs ", wb[i]);
    }
  }
  EXPECT_LT(worst, 1e-4) << run << ": worst weight " << worst_at;
  std::printf("[ %s ] worst tensor %.3g (%s), worst element %.3g at %s\n", run.c_str(), worst_norm,
              worst_tensor.c_str(), worst, worst_at.c_str());
}

void expect_same_training(const Job& job, const std::string& ref, const std::string& run) {
  const auto a = job.losses(ref), b = job.losses(run);
  ASSERT_EQ(a.size(), b.size()) << run;
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << run << ": loss of step " << i + 1;
  expect_same_weights(job, ref, run);
}

// The comparisons of whole CPU runs across rank counts run every process on one thread. OpenBLAS
// picks its kernels by CPU and OPENBLAS_CORETYPE, and some of them (Haswell's, for one) split a
// product's sums differently with the thread count; Adam turns those last-bit differences into 2.6e-4
// of a weight over 4 steps (measured with OPENBLAS_CORETYPE=Haswell, 2 threads against 1). With one
// thread everywhere each micro-batch is the same computation in every run, and what remains is what
// these tests are about: the order in which the ranks' gradients are summed.
constexpr int kThreads = 1;

void check_zero_stage(int stage) {
  const Job job(scratch_dir());
  std::printf("seed 7, 4 steps of 12 sequences (6 micro-batches of 2), ZeRO stage %d, %d thread per process\n",
              stage, kThreads);
  const auto ref = run_cli(job.train_args("one", 4) + " --save-init", kThreads);
  ASSERT_EQ(ref.status, 0) << ref.err;
  struct Case {
    int np;
    std::string flags, name;
  };
  std::vector<Case> cases = {
      {1, "", "np1"},
      {2, "", "np2"},
      {3, "", "np3"},
      {2, "--balance static --rank-weights 1,2", "np2_static"},    // 2 + 4 micro-batches
      {3, "--balance static --rank-weights 3,1,2", "np3_static"},  // 3 + 1 + 2
  };
  // Stages 2 and 3 reduce (and stage 3 gathers) per micro-batch and block: also 4 ranks, and a
  // rank with no micro-batch at all, which joins the others' collectives.
  if (stage >= 2) {
    cases.push_back({4, "", "np4"});
    cases.push_back({3, "--balance static --rank-weights 4,0,2", "np3_idle"});
    cases.push_back({3, "--save-init", "np3_init"});  // stage 3 streams the shards to the file
  }
  // Stage 3 from an HDF5 --init-from: each rank reads only its shard of the file.
  if (stage == 3) cases.push_back({3, "--init-from '" + (job.dir / "one" / "init.h5").string() + "'", "np3_from"});
  const std::string zero = " --zero " + std::to_string(stage) + " ";
  for (const Case& c : cases) {
    std::string args = job.train_args(c.name, 4);
    if (c.flags.find("--init-from") != std::string::npos) args.erase(args.find("--model-config tiny "), 20);
    const auto r = run_mpi(c.np, args + zero + c.flags, kThreads);
    ASSERT_EQ(r.status, 0) << c.name << "\n" << r.err;
    expect_same_training(job, "one", c.name);
  }
  if (stage >= 2) {
    const auto init = lt::load_model((job.dir / "np3_init" / "init.h5").string()).params;
    EXPECT_EQ(init, lt::load_model((job.dir / "one" / "init.h5").string()).params) << "--save-init's weights";
  }
  EXPECT_EQ(job.metrics("np3_static", "step")[0]["split"], nlohmann::json({3, 1, 2}));
  EXPECT_EQ(job.metrics("np2", "step")[0]["split"], nlohmann::json({3, 3}));
  // The memory table: optimizer state per rank is 8 bytes per owned parameter.
  const size_t n = lt::ParameterLayout(lt::preset_config("tiny")).total();
  for (const char* name : {"np1", "np2", "np3"}) {
    const auto mem = job.metrics(name, "memory").at(0);
    const int W = mem["world_size"];
    EXPECT_EQ(mem["n_params"], n);
    for (const auto& row : mem["ranks"]) {
      const double opt = row["optimizer_bytes"];
      const double expect = stage == 0 ? 8.0 * n : 8.0 * double((n + W - 1) / W);
      if (row["rank"] != W - 1 || stage == 0) EXPECT_EQ(opt, expect) << name;
      else EXPECT_LE(opt, expect) << name;
    }
  }
}

// Issue 18's memory and traffic figures, on 2 ranks with a model large enough (24M parameters,
// 92 MiB of fp32) that the program and its libraries do not dominate: each stage's measured peak
// resident memory of rank 0 (the step record's host_peak_rss_bytes less the resident bytes before
// the model was allocated) within 10% of the memory table's total, the table's parameter and
// optimizer bytes falling with the stage, and the ZeRO traffic of a step against plain data
// parallelism's all-reduce: stages 0, 1 and 2 1x (stages 1 and 2 reduce-scatter the gradient and
// all-gather the updated shards, block by block; stage 1's last bucket carries the padding, a few
// bytes); stage 3 the textbook 1.5x
// (gather forward, gather backward, reduce-scatter) less the embeddings' backward gather, which
// the embedding's backward does not need.
TEST(DataParallel, MemoryAndTrafficOfEveryStageMatchTheTable) {
  const Job job(scratch_dir());
  const std::string model = " --dim 512 --hidden-dim 1376 --n-layers 8 --n-heads 8 --n-kv-heads 4";
  lt::Llama2Config cfg = lt::preset_config("tiny");
  cfg.dim = 512, cfg.hidden_dim = 1376, cfg.n_layers = 8, cfg.n_heads = 8, cfg.n_kv_heads = 4, cfg.vocab_size = 512;
  const lt::ParameterLayout layout(cfg);
  const double n = double(layout.total()), padded = double(lt::ShardLayout(layout.total(), 2).padded);
  const double emb = double(layout.blocks[0].size());
  struct Case {
    int stage;
    const char* grads;
    double traffic;  // expected, as a multiple of one fp32 all-reduce of the gradient
  };
  // Stage 3 gathers the weights for forward and (all but the embeddings) for backward and
  // reduce-scatters the gradient; bf16 gradients halve the reduce-scatter.
  const Case cases[] = {{0, "fp32", 1.0},
                        {1, "fp32", (n + padded) / (2 * n)},
                        {2, "fp32", 1.0},
                        {3, "fp32", (3 * n - emb) / (2 * n)},
                        {3, "bf16", (2.5 * n - emb) / (2 * n)}};
  std::printf("model %.0f parameters, 2 ranks, 2 steps of one micro-batch of 2 per rank, 1 thread\n", n);
  double last_state = 0;
  for (const Case& c : cases) {
    const std::string name = lt::strcat("mem", c.stage, c.grads);
    const auto r = run_mpi(2, job.train_args(name, 2, 4) + model + lt::strcat(" --zero ", c.stage) +
                                  " --grad-reduce-dtype " + c.grads, kThreads);
    ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
    const auto mem = job.metrics(name, "memory").at(0);
    const auto step = job.metrics(name, "step").at(1);
    const auto& row = mem["ranks"][0];
    const double table = row["total_bytes"];
    const double measured = double(step["host_peak_rss_bytes"]) - double(mem["host_rss_before_model_bytes"]);
    const double traffic = step["comm_bytes"]["vs_data_parallel"];
    std::printf("ZeRO %d, %s gradients: table %.1f MiB (params %.1f, grads %.1f, optimizer %.1f, activations %.1f, "
                "blocks %.1f), measured %.1f MiB (%.3f of the table); traffic %.4f x data parallel (expected %.4f)\n",
                c.stage, c.grads, table / 1048576, double(row["params_bytes"]) / 1048576,
                double(row["grads_bytes"]) / 1048576, double(row["optimizer_bytes"]) / 1048576,
                double(row["activation_bytes"]) / 1048576, double(row["gathered_bytes"]) / 1048576, measured / 1048576,
                measured / table, traffic, c.traffic);
    EXPECT_NEAR(measured / table, 1.0, 0.10) << name;
    EXPECT_NEAR(traffic, c.traffic, 1e-9) << name;
    // Stage 3 streams the final model from the shards a tensor at a time: writing it leaves the
    // peak where training had it (gathering the whole weights, as before, raised it to 1.77 of the
    // table: the gathered buffer and the writer's copy of it).
    if (c.stage == 3) {
      const auto saved = job.metrics(name, "model").at(0);
      const double after = double(saved["host_peak_rss_bytes"]) - double(mem["host_rss_before_model_bytes"]);
      std::printf("  after writing model.h5: peak %.1f MiB (%.3f of the table)\n", after / 1048576, after / table);
      EXPECT_LT(after / table, 1.10) << name << ": the final model's write raised the peak";
    }
    const double state = double(row["params_bytes"]) + double(row["grads_bytes"]) + double(row["optimizer_bytes"]);
    if (last_state > 0) EXPECT_LT(state, last_state) << name << " holds no less than the case before";
    last_state = state;
  }
}

// --grad-reduce-dtype bf16 (grad_shard.h): the gradients cross the wire in bf16 and, with ZeRO 2
// and 3, the rank's gradient shard is bf16, stochastically rounded. Against the same run in fp32:
// the losses of `steps` steps within 1e-3 relative, and each weight tensor within 2e-2 relative
// in L2, a few bf16 units (2^-7): Adam divides each gradient by its own running magnitude, so a
// bf16 rounding of a small gradient moves its weight by a fraction of the learning rate all the
// same (measured: losses 2.4e-5, weights 5.9e-3 at lr 3e-3 over 6 steps), and the gradient
// shard's bytes and the gradient reductions' wire bytes halved. `device`: extra flags (--device
// cuda-sim, whose ZeRO 1 optimizer reduces its buckets in bf16 once per step and keeps fp32
// gradients).
struct Bf16Case {
  int np, zero;
};
void check_bf16_gradients(const std::vector<Bf16Case>& cases, const std::string& device, int steps,
                          int global_batch) {
  const Job job(scratch_dir());
  std::printf("seed 7, %d steps of %d sequences, 1 thread per process%s\n", steps, global_batch, device.c_str());
  const lt::ParameterLayout layout(lt::preset_config("tiny"));
  for (const Bf16Case c : cases) {
    const std::string tag = lt::strcat("np", c.np, "_z", c.zero), flags = lt::strcat(" --zero ", c.zero, device);
    const auto f = run_mpi(c.np, job.train_args(tag + "_fp32", steps, global_batch) + flags, kThreads);
    ASSERT_EQ(f.status, 0) << f.err;
    const auto b = run_mpi(c.np, job.train_args(tag + "_bf16", steps, global_batch) + flags + " --grad-reduce-dtype bf16",
                           kThreads);
    ASSERT_EQ(b.status, 0) << b.err;
    const auto lf = job.losses(tag + "_fp32"), lb = job.losses(tag + "_bf16");
    ASSERT_EQ(lf.size(), size_t(steps));
    ASSERT_EQ(lb.size(), size_t(steps));
    double worst_loss = 0;
    for (size_t i = 0; i < lf.size(); ++i) worst_loss = std::max(worst_loss, std::abs(lb[i] / lf[i] - 1));
    EXPECT_LT(worst_loss, 1e-3) << tag;
    const auto wf = job.weights(tag + "_fp32"), wb = job.weights(tag + "_bf16");
    double worst_tensor = 0;
    std::string worst_name;
    for (const auto& t : layout.tensors()) {
      double d2 = 0, r2 = 0;
      for (size_t i = t.offset; i < t.offset + t.numel; ++i)
        d2 += (double(wb[i]) - wf[i]) * (double(wb[i]) - wf[i]), r2 += double(wf[i]) * wf[i];
      if (std::sqrt(d2 / r2) > worst_tensor) worst_tensor = std::sqrt(d2 / r2), worst_name = t.name;
    }
    EXPECT_LT(worst_tensor, 2e-2) << tag << ": " << worst_name;
    EXPECT_GT(worst_tensor, 0.0) << tag << ": the bf16 run is the fp32 run";
    const auto mf = job.metrics(tag + "_fp32", "memory").at(0), mb = job.metrics(tag + "_bf16", "memory").at(0);
    EXPECT_EQ(mb["grad_reduce_dtype"], "bf16");
    const double gf = mf["ranks"][0]["grads_bytes"], gb = mb["ranks"][0]["grads_bytes"];
    EXPECT_EQ(gb, c.zero >= 2 ? gf / 2 : gf) << tag << ": ZeRO 2 and 3 keep a bf16 shard, 0 and 1 fp32 gradients";
    const auto sf = job.metrics(tag + "_fp32", "step").at(0)["comm_bytes"];
    const auto sb = job.metrics(tag + "_bf16", "step").at(0)["comm_bytes"];
    // Every stage above 0 reduce-scatters, on the CPU and a device alike.
    const char* reduction = c.zero > 0 ? "reduce_scatter" : "allreduce";
    EXPECT_GT(double(sf[reduction]), 0.0) << tag;
    EXPECT_EQ(double(sb[reduction]), double(sf[reduction]) / 2) << tag;
    EXPECT_EQ(double(sb["allgather"]), double(sf["allgather"])) << tag;
    std::printf("%s: losses within %.3g relative, weights within %.3g (worst tensor %s); rank 0 gradient bytes "
                "%.0f -> %.0f, %s bytes per step %.0f -> %.0f, all-gather %.0f\n", tag.c_str(), worst_loss,
                worst_tensor, worst_name.c_str(), gf, gb, reduction, double(sf[reduction]), double(sb[reduction]),
                double(sb["allgather"]));
  }
}

TEST(DataParallel, Bf16GradientsFollowFp32) { check_bf16_gradients({{2, 1}, {3, 2}, {2, 3}}, "", 6, 12); }
// The device's three paths (ZeRO 1's buckets reduce-scattered in bf16; true ZeRO 2's and ZeRO 3's
// blocks reduced in bf16 into bf16 shards) in 3 steps of 3 micro-batches each, to keep the suite's
// time (2 ranks: 2 + 1 micro-batches, uneven; 3 ranks: one each).
TEST(CudaSimTraining, Bf16GradientsFollowFp32) {
  check_bf16_gradients({{2, 1}, {3, 2}, {2, 3}}, " --device cuda-sim", 3, 6);
}

// A LoRA run's flags: rank 4, alpha 8 on all seven products of the model `base` trained (--init-from).
std::string lora_args(const Job& job, const std::string& name, int steps, const std::string& base = "base") {
  std::string a = job.train_args(name, steps);
  a.erase(a.find("--model-config tiny "), 20);
  return a + " --init-from '" + (job.dir / base / "model.h5").string() + "' --lora-rank 4 --lora-alpha 8 ";
}

// LoRA (issue 36): the adapters' gradients are reduced across ranks as a model's are, ZeRO 1 and 2
// shard their optimizer state, and ZeRO 3 also keeps only each rank's shard of the frozen base,
// which the passes gather a block at a time (a rank idle in a round joins the gathers; the merged
// model.h5 is written a tensor at a time from the shards): every rank count, stage and split trains
// what one process does.
TEST(DataParallel, LoraSameAsOneProcess) {
  const Job job(scratch_dir());
  const auto base = run_cli(job.train_args("base", 2), kThreads);
  ASSERT_EQ(base.status, 0) << base.err;
  auto args = [&](const std::string& name) { return lora_args(job, name, 4); };
  std::printf("seed 7, 4 steps of 12 sequences from a 2-step base, LoRA rank 4 on all seven products, %d thread\n",
              kThreads);
  const auto ref = run_cli(args("one") + "--zero 0", kThreads);
  ASSERT_EQ(ref.status, 0) << ref.err;
  const std::vector<std::pair<int, std::string>> cases = {
      {2, "--zero 0"}, {2, "--zero 1"}, {3, "--zero 1"}, {3, "--zero 1 --balance static --rank-weights 3,1,2"},
      {2, "--zero 2"}, {2, "--zero 3"}, {3, "--zero 3 --balance static --rank-weights 4,0,2"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = "np" + std::to_string(cases[i].first) + "_" + std::to_string(i);
    const auto r = run_mpi(cases[i].first, args(name) + cases[i].second, kThreads);
    ASSERT_EQ(r.status, 0) << name << " " << cases[i].second << "\n" << r.err;
    expect_same_training(job, "one", name);
    if (cases[i].second.find("--zero 3") == std::string::npos) continue;
    // The host holds its shard of the base, not the whole (plus the adapters and their Adam state).
    const auto mem = job.metrics(name, "memory").at(0);
    const double n = mem["n_params"], np = cases[i].first, held = mem["host_state_bytes"];
    std::printf("[ %s ] host state %.0f bytes against the whole base's %.0f\n", name.c_str(), held, 4 * n);
    EXPECT_LT(held, 4 * n / np + 0.25 * 4 * n / np) << name;
    EXPECT_GT(double(mem["ranks"][0]["gathered_bytes"]), 0.0) << name;
  }
  EXPECT_NE(job.weights("one"), job.weights("base")) << "the adapters were merged into model.h5";
}

// LoRA on --device cuda-sim (issue 36): the CUDA engine's adapters (bf16 working copy, fp32
// gradients, the host's optimizer) follow the CPU's within the bf16 tolerance of the cuda-sim
// tests (1e-2 relative on each step's loss), with dropout 0.1 drawing the same masks on both; and
// without dropout (whose masks differ by rank) 3 ranks at ZeRO 3 (the base's bf16 shards gathered
// on the device, rank 1 idle: split 4,0,2) train what 2 at ZeRO 1 do (1e-5, as above), whose
// checkpoint of step 2 resumes bit-identically.
TEST(CudaSimTraining, LoraFollowsTheCpuAndResumes) {
  const Job job(scratch_dir());
  const auto base = run_cli(job.train_args("base", 2), kThreads);
  ASSERT_EQ(base.status, 0) << base.err;
  std::printf("seed 7, 4 steps of 12 sequences from a 2-step base, LoRA rank 4 on all seven products\n");
  const std::string sim = "--device cuda-sim ";
  const auto cpu = run_cli(lora_args(job, "cpu", 4) + "--lora-dropout 0.1", kThreads);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  const auto one = run_cli(lora_args(job, "sim1", 4) + sim + "--lora-dropout 0.1", kThreads);
  ASSERT_EQ(one.status, 0) << one.err;
  const auto lc = job.losses("cpu"), l1 = job.losses("sim1");
  ASSERT_EQ(lc.size(), 4u);
  ASSERT_EQ(l1.size(), lc.size());
  for (size_t i = 0; i < lc.size(); ++i) {
    std::printf("step %zu loss cpu %.9g cuda-sim %.9g\n", i + 1, lc[i], l1[i]);
    EXPECT_NEAR(l1[i], lc[i], 1e-2 * lc[i]) << "step " << i + 1;
  }
  EXPECT_NE(job.weights("sim1"), job.weights("base")) << "the adapters were merged into model.h5";

  const std::string ck = (job.dir / "ck").string();
  const auto two = run_mpi(2, lora_args(job, "sim2", 4) + sim + "--zero 1 --checkpoint-dir '" + ck +
                                  "' --checkpoint-every 2 --keep-last 0", kThreads);
  ASSERT_EQ(two.status, 0) << two.err;
  const auto three = run_mpi(3, lora_args(job, "sim3", 4) + sim + "--zero 3 --balance static --rank-weights 4,0,2",
                             kThreads);
  ASSERT_EQ(three.status, 0) << three.err;
  expect_same_training(job, "sim2", "sim3");
  const auto again = run_mpi(2, lora_args(job, "again", 4) + sim + "--zero 1 --resume '" + ck + "/step-00000002'",
                             kThreads);
  ASSERT_EQ(again.status, 0) << again.err;
  const auto l2 = job.losses("sim2"), la = job.losses("again"), l3 = job.losses("sim3");
  ASSERT_EQ(la.size(), 2u);
  std::printf("losses np2 ZeRO 1: %.9g %.9g %.9g %.9g; np3 ZeRO 3: %.9g %.9g %.9g %.9g; resumed: %.9g %.9g\n", l2[0],
              l2[1], l2[2], l2[3], l3[0], l3[1], l3[2], l3[3], la[0], la[1]);
  EXPECT_EQ(la[0], l2[2]) << "step 3 not bit-identical after the resume";
  EXPECT_EQ(la[1], l2[3]) << "step 4 not bit-identical after the resume";
}

TEST(DataParallel, Zero0SameAsOneProcess) { check_zero_stage(0); }
TEST(DataParallel, Zero1SameAsOneProcess) { check_zero_stage(1); }
TEST(DataParallel, Zero2SameAsOneProcess) { check_zero_stage(2); }
TEST(DataParallel, Zero3SameAsOneProcess) { check_zero_stage(3); }

// --zero 3 on cuda-sim (device_zero.h, device_zero_blocks.h): each rank keeps bf16 weight and fp32
// gradient shards on the device, the passes gather each block before use and reduce its
// gradients block by block, every micro-batch; a rank without a micro-batch joins the others'
// rounds idle. True ZeRO 2 reduces the same way with whole weights. 2 ranks (ZeRO 3), and 3 with
// the split 4,0,2 (ZeRO 2 and 3), against ZeRO 1 on one rank: losses within 1e-5 (measured: the
// same bits) and every weight tensor as expect_same_training asks; the device's peak memory on 2
// ranks below ZeRO 1's on 2 ranks (no whole weights or gradients). --offload-optimizer (the AdamW
// update on the host, lt::cpu::adamw_update, the device kernel's twin) gives the same bits as the
// device's update: ZeRO 1 on 2 ranks and ZeRO 3 on 3 with the split, losses and final weights.
TEST(CudaSimTraining, ShardedStagesSameAsZero1) {
  const Job job(scratch_dir());
  // 3 micro-batches a step: 2 + 1 on 2 ranks, 2 + 0 + 1 with the split on 3 (rank 1 idle).
  std::printf("seed 7, 2 steps of 6 sequences (3 micro-batches of 2), --device cuda-sim\n");
  const std::string sim = " --device cuda-sim";
  const auto args = [&](const std::string& name) { return job.train_args(name, 2, 6); };
  const auto one = run_cli(args("z1") + sim, kThreads);
  ASSERT_EQ(one.status, 0) << one.err;
  const auto z1 = run_mpi(2, args("z1np2") + sim + " --zero 1", kThreads);
  ASSERT_EQ(z1.status, 0) << z1.err;
  const auto two = run_mpi(2, args("z3np2") + sim + " --zero 3", kThreads);
  ASSERT_EQ(two.status, 0) << two.err;
  const std::string split = " --balance static --rank-weights 4,0,2";
  const auto three = run_mpi(3, args("z3np3") + sim + " --zero 3" + split, kThreads);
  ASSERT_EQ(three.status, 0) << three.err;
  const auto three2 = run_mpi(3, args("z2np3") + sim + " --zero 2" + split, kThreads);
  ASSERT_EQ(three2.status, 0) << three2.err;
  for (const char* name : {"z3np3", "z2np3"})
    EXPECT_EQ(job.metrics(name, "step").at(0)["split"], nlohmann::json::array({2, 0, 1})) << name;
  expect_same_training(job, "z1", "z2np3");
  expect_same_training(job, "z1", "z3np2");
  expect_same_training(job, "z1", "z3np3");
  const auto off1 = run_mpi(2, args("z1np2off") + sim + " --zero 1 --offload-optimizer", kThreads);
  ASSERT_EQ(off1.status, 0) << off1.err;
  const auto off3 = run_mpi(3, args("z3np3off") + sim + " --zero 3 --offload-optimizer" + split, kThreads);
  ASSERT_EQ(off3.status, 0) << off3.err;
  for (const auto& [ref, off] : {std::pair<std::string, std::string>{"z1np2", "z1np2off"}, {"z3np3", "z3np3off"}}) {
    const auto a = job.losses(ref), b = job.losses(off);
    ASSERT_EQ(a.size(), b.size()) << off;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << off << ": loss of step " << i + 1;
    const auto wa = job.weights(ref), wb = job.weights(off);
    ASSERT_EQ(wa.size(), wb.size()) << off;
    size_t differ = 0;
    for (size_t i = 0; i < wa.size(); ++i) differ += wa[i] != wb[i];
    std::printf("[ %s ] losses %.9g %.9g, %zu of %zu final weights differ from %s\n", off.c_str(), b[0], b.back(),
                differ, wb.size(), ref.c_str());
    EXPECT_EQ(differ, 0u) << off;
  }
  const double peak1 = job.metrics("z1np2", "step").back()["device_peak_bytes"];
  const double peak3 = job.metrics("z3np2", "step").back()["device_peak_bytes"];
  std::printf("device peak on 2 ranks: ZeRO 1 %.0f bytes, ZeRO 3 %.0f bytes (%.3f)\n", peak1, peak3, peak3 / peak1);
  EXPECT_LT(peak3, peak1);
}

// The memory table of a device run (device_memory_table: bf16 weights, fp32 gradients, master and
// Adam, the gradient scratch of ZeRO 2 and 3 and ZeRO 3's gathered slots, the pass's activations,
// cuBLASLt's workspace) against the device ledger's peak on cuda-sim, 2 ranks, every stage: within
// 2% (issue 18 asks 10%; measured 0.02-0.03%, the batch and loss slots the table leaves out); the
// parameter + optimizer bytes per rank falling with the stage: 14, 8 and 7 bytes per parameter at
// stages 0, 1 and 3 on 2 ranks; the gradient bytes halved from stage 1 to 2 (true ZeRO 2: the
// rank's shard only); and the host's copy of the weights and Adam state (the staging of
// checkpoints and the final model) whole at stage 0, 12 bytes per parameter of the rank's shard
// from stage 1 on (issue 18 item 3: host memory of one shard). The fifth run, ZeRO 3 with
// --offload-optimizer, keeps no optimizer state on the device (the table's optimizer column 0,
// and the ledger's peak within 2% of that table) and the same host state.
TEST(CudaSimTraining, DeviceMemoryMatchesTheTable) {
  const Job job(scratch_dir());
  std::printf("a 4-layer dim-128 model, 2 ranks, micro-batches of 2 x 64 tokens, --device cuda-sim\n");
  double params_opt[5] = {}, grads[5] = {}, host[5] = {}, opt[5] = {}, n = 0;
  for (int run = 0; run <= 4; ++run) {
    const int zero = std::min(run, 3);
    const std::string name = lt::strcat("mem", run), offload = run == 4 ? " --offload-optimizer" : "";
    const auto r = run_mpi(2, job.train_args(name, 1, 8) + lt::strcat(" --device cuda-sim --dim 128 --hidden-dim 384 "
                                                                      "--n-layers 4 --zero ", zero, offload), kThreads);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto row = job.metrics(name, "memory").at(0)["ranks"][0];
    const double table = row["total_bytes"], peak = job.metrics(name, "step").back()["device_peak_bytes"];
    params_opt[run] = double(row["params_bytes"]) + double(row["optimizer_bytes"]);
    opt[run] = double(row["optimizer_bytes"]);
    grads[run] = double(row["grads_bytes"]);
    host[run] = double(job.metrics(name, "memory").at(0)["host_state_bytes"]);
    n = double(job.metrics(name, "memory").at(0)["n_params"]);
    std::printf("ZeRO %d%s: table %.0f bytes (workspace %.0f, gathered %.0f, optimizer %.0f), device peak %.0f: %.5f\n",
                zero, offload.c_str(), table, double(row["workspace_bytes"]), double(row["gathered_bytes"]), opt[run],
                peak, peak / table);
    EXPECT_NEAR(peak / table, 1.0, 0.02) << "ZeRO " << zero << offload;
    if (zero >= 2) EXPECT_GT(double(row["gathered_bytes"]), 0.0);
  }
  EXPECT_EQ(opt[4], 0.0);
  EXPECT_GT(opt[3], 0.0);
  EXPECT_DOUBLE_EQ(host[4], host[3]);
  // bf16 weights + fp32 master, m, v: 2 + 12 bytes per parameter whole at stage 0; 2 + 6 at stage 1
  // (the weights whole, the optimizer halved); 1 + 6 at stage 3 (the weights halved too).
  EXPECT_NEAR(params_opt[1] / params_opt[0], 8.0 / 14.0, 1e-3);
  EXPECT_NEAR(params_opt[3] / params_opt[0], 7.0 / 14.0, 1e-3);
  EXPECT_DOUBLE_EQ(grads[2] / grads[1], 0.5);
  const lt::ShardLayout shards(size_t(n), 2);
  std::printf("host state bytes: ZeRO 0 %.0f, 1 %.0f, 2 %.0f, 3 %.0f (%zu parameters, shard %zu)\n", host[0], host[1],
              host[2], host[3], size_t(n), shards.shard);
  EXPECT_DOUBLE_EQ(host[0], 4.0 * double(shards.padded) + 8.0 * n);  // padded fp32 weights, Adam m, v
  for (int zero = 1; zero <= 3; ++zero) EXPECT_DOUBLE_EQ(host[zero], 12.0 * double(shards.shard)) << "ZeRO " << zero;
}

// The data of these tests is such that averaging per rank would be wrong: with the 2 + 4 split of
// the first step, the two ranks' loss tokens are not in the ratio of their sequences.
// --device cuda-sim: the CUDA backend's host code with its kernels in the simulator trains the
// tiny model like the CPU backend (bf16 activations: losses within 1e-2 relative, STYLE.md), and
// 2 ranks like 1: the device math is the same on every machine (the kernels run one block at a time
// and the simulator's cuBLASLt sums in one fixed order, whatever BLAS, core type or thread count the
// machine has), and only the fp32 gradient sums are taken in another order across ranks. That moves
// a master weight by an ulp or two, which changes its bf16 copy only where it sits on a rounding
// boundary: 1e-5 relative on the loss leaves room for a few such flips (measured: equal to 9 digits).
TEST(CudaSimTraining, FollowsTheCpuOn1And2Ranks) {
  const Job job(scratch_dir());
  std::printf("seed 7, 3 steps of 12 sequences (6 micro-batches of 2), ZeRO 1\n");
  const auto cpu = run_cli(job.train_args("cpu", 3) + " --device cpu");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  const auto one = run_cli(job.train_args("sim1", 3) + " --device cuda-sim");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.err.find("train: device cuda-sim: CUDA simulator"), std::string::npos) << one.err;
  const auto two = run_mpi(2, job.train_args("sim2", 3) + " --device cuda-sim");
  ASSERT_EQ(two.status, 0) << two.err;
  // 3 ranks, ZeRO 2: uneven shards, the per-layer buckets reduced to their owners (MPI in place of
  // NCCL), AdamW on each rank's shard on the device and the bf16 weights all-gathered.
  const auto three = run_mpi(3, job.train_args("sim3", 3) + " --device cuda-sim --zero 2");
  ASSERT_EQ(three.status, 0) << three.err;
  const auto lc = job.losses("cpu"), l1 = job.losses("sim1"), l2 = job.losses("sim2"), l3 = job.losses("sim3");
  ASSERT_EQ(lc.size(), 3u);
  ASSERT_EQ(l1.size(), lc.size());
  ASSERT_EQ(l2.size(), lc.size());
  ASSERT_EQ(l3.size(), lc.size());
  for (size_t i = 0; i < lc.size(); ++i) {
    std::printf("step %zu loss cpu %.9g cuda-sim %.9g cuda-sim np2 %.9g np3 ZeRO 2 %.9g\n", i + 1, lc[i], l1[i], l2[i],
                l3[i]);
    EXPECT_NEAR(l1[i], lc[i], 1e-2 * lc[i]) << "step " << i + 1;
    EXPECT_NEAR(l2[i], l1[i], 1e-5 * l1[i]) << "step " << i + 1;
    EXPECT_NEAR(l3[i], l1[i], 1e-5 * l1[i]) << "step " << i + 1;
  }
  EXPECT_LT(l1.back(), l1.front()) << "cuda-sim did not learn";
  // The final fp32 master weights, gathered from the three devices' shards, are the 1-rank ones.
  expect_same_training(job, "sim1", "sim3");
  // The start-of-run device report (a table by node on stderr, a "devices" record) and the
  // per-rank MFU of every step, from each rank's measured GEMM rate.
  EXPECT_NE(two.err.find("devices (GEMM rate measured at start: bf16 256^3 CPU BLAS (simulator)"), std::string::npos)
      << two.err;
  const auto devices = job.metrics("sim2", "devices");
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0]["device"], "cuda-sim");
  ASSERT_EQ(devices[0]["ranks"].size(), 2u);
  for (const auto& r : devices[0]["ranks"]) {
    EXPECT_GT(r["gemm_tflops"].get<double>(), 0.0);
    EXPECT_NE(r["device"].get<std::string>().find("CUDA simulator"), std::string::npos);
  }
  for (const auto& r : devices[0]["ranks"]) EXPECT_GT(r["peak_tflops"].get<double>(), 0.0) << "the host CPU's peak";
  for (const auto& st : job.metrics("sim2", "step")) {
    ASSERT_EQ(st["rank_mfu"].size(), 2u);
    ASSERT_EQ(st["mfu_vs_measured_gemm"].size(), 2u);
    for (const auto& m : st["rank_mfu"]) {
      EXPECT_GT(m.get<double>(), 0.0);
      EXPECT_LT(m.get<double>(), 1.0) << "a rank cannot beat its dense peak";
    }
    for (const auto& m : st["mfu_vs_measured_gemm"]) EXPECT_GT(m.get<double>(), 0.0);
  }
  const auto test_cpu = job.metrics("cpu", "epoch"), test_sim = job.metrics("sim1", "epoch");
  ASSERT_FALSE(test_cpu.empty());
  ASSERT_FALSE(test_sim.empty());
  EXPECT_NEAR(test_sim[0]["test_loss"].get<double>(), test_cpu[0]["test_loss"].get<double>(),
              1e-2 * test_cpu[0]["test_loss"].get<double>());
}

// --precision bf16 on the CPU (oneDNN products, fp32 master weights and optimizer) follows the
// fp32 run within the bf16 tolerance of the cuda-sim tests (1e-2 relative on every step's loss),
// and trains alike on 1, 2 and 3 ranks in every ZeRO stage and recompute mode: one thread per
// process makes each micro-batch the same computation everywhere, and only the fp32 gradient sums
// are taken in another order across ranks, which moves a master weight by an ulp or two and flips
// its bf16 copy only where it sits on a rounding boundary (the cuda-sim tests' argument): 1e-6
// relative on the loss (2.3e-8 measured; a run that fell back to fp32 products differs from the
// bf16 run by 7e-6 to 4e-5). Recompute modes refill the same bf16 copies, so they change nothing.
// ZeRO 3 copies each block's gathered weights to bf16 as it is acquired: the same bf16 values.
TEST(CpuBf16Training, FollowsFp32On1To3RanksEveryZeroStageAndRecompute) {
  const Job job(scratch_dir());
  std::printf("seed 7, 3 steps of 12 sequences (6 micro-batches of 2), %d thread per process\n", kThreads);
  const auto fp32 = run_cli(job.train_args("fp32", 3) + " --device cpu", kThreads);
  ASSERT_EQ(fp32.status, 0) << fp32.err;
  const auto one = run_cli(job.train_args("bf16", 3) + " --device cpu --precision bf16", kThreads);
  // A CPU without AVX-512 (oneDNN has no bf16 products there) refuses bf16: CpuBf16Cli tests that.
  if (one.status != 0 && one.err.find("has no bf16 matrix products for this CPU's ISA") != std::string::npos)
    GTEST_SKIP() << one.err;
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.err.find("precision bf16"), std::string::npos) << one.err;
  struct Case {
    int np, zero;
    const char* recompute;
  };
  const std::vector<Case> cases = {{1, 0, "full"}, {2, 0, "attn"}, {2, 1, "none"}, {3, 1, "full"}, {2, 2, "full"},
                                   {3, 2, "attn"}, {3, 0, "none"}, {2, 3, "none"}, {3, 3, "full"}, {1, 3, "attn"}};
  const auto lf = job.losses("fp32"), lb = job.losses("bf16");
  ASSERT_EQ(lf.size(), 3u);
  ASSERT_EQ(lb.size(), lf.size());
  for (size_t i = 0; i < lf.size(); ++i) {
    std::printf("step %zu loss fp32 %.9g bf16 %.9g\n", i + 1, lf[i], lb[i]);
    EXPECT_NEAR(lb[i], lf[i], 1e-2 * lf[i]) << "step " << i + 1;
  }
  EXPECT_LT(lb.back(), lb.front()) << "bf16 did not learn";
  for (const Case& c : cases) {
    const std::string name = lt::strcat("bf16_np", c.np, "_zero", c.zero, "_", c.recompute);
    const auto r = run_mpi(c.np,
                           job.train_args(name, 3) + lt::strcat(" --device cpu --precision bf16 --zero ", c.zero,
                                                                " --recompute ", c.recompute),
                           kThreads);
    ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
    const auto l = job.losses(name);
    ASSERT_EQ(l.size(), lb.size()) << name;
    for (size_t i = 0; i < l.size(); ++i) {
      std::printf("%s step %zu loss %.9g (1 process bf16 %.9g, rel %.2e)\n", name.c_str(), i + 1, l[i], lb[i],
                  std::abs(l[i] - lb[i]) / lb[i]);
      EXPECT_NEAR(l[i], lb[i], 1e-6 * lb[i]) << name << " step " << i + 1;
      EXPECT_NEAR(l[i], lf[i], 1e-2 * lf[i]) << name << " step " << i + 1 << " against fp32";
    }
    // The bf16 copies the products held at once (Bf16Matmuls::peak_bytes) are what the memory
    // table adds for them (cpu_bf16_copy_bytes), to the byte.
    const lt::Llama2Config cfg = lt::preset_config("tiny");
    const lt::Bf16CopyBytes b =
        lt::cpu_bf16_copy_bytes(cfg, lt::ShardLayout(lt::ParameterLayout(cfg).total(), c.np).padded, c.zero, 2, 64,
                                c.recompute == std::string("full")   ? lt::Recompute::kFull
                                : c.recompute == std::string("attn") ? lt::Recompute::kAttn
                                                                     : lt::Recompute::kNone);
    EXPECT_EQ(double(job.metrics(name, "step").back()["host_bf16_copy_peak_bytes"]), b.weights + b.blocks + b.operands)
        << name;
  }
}

// The memory table of a bf16 CPU run (the fp32 path's, plus cpu_bf16_copy_bytes: the weights'
// bf16 copy with the parameters, the products' operand copies with the activations, ZeRO 3's one
// layer's bf16 weights with the blocks) against rank 0's peak resident memory less what it held
// before the model, on 2 ranks with a 24M-parameter model, ZeRO 1 without recomputation and ZeRO
// 3 with full recomputation: from 5% under the table to 5% over it plus 32 MiB. What the table
// leaves out is oneDNN's run-time state (JIT-compiled kernels, scratchpads; mapping the library is
// 2 MiB of it; the same fp32 run measures 1.009), a fixed amount rather than a share of the model:
// on a 2-core AMD EPYC (oneDNN's ISA there: avx512_core_bf16, no AMX) ZeRO 1 measured 358.3 MiB of
// table + 20.6 MiB, ZeRO 3 220.5 MiB + 23-33 MiB (1.106-1.151 over nine runs, in two clusters 9 MiB
// apart, with the binaries of f4d2b1c and of its successor alike). Measured 1.043 and 1.083 where
// first written; before the bf16 copies were counted 1.22 and 1.12 (their bytes are checked exactly
// by CpuBf16Training.FollowsFp32On1To3RanksEveryZeroStageAndRecompute). Issue 18's 10% holds for
// the fp32 path (DataParallel.MemoryAndTrafficOfEveryStageMatchTheTable).
TEST(CpuBf16Training, MemoryMatchesTheTable) {
  const Job job(scratch_dir());
  const std::string model = " --dim 512 --hidden-dim 1376 --n-layers 8 --n-heads 8 --n-kv-heads 4";
  for (const auto& [zero, recompute] : {std::pair<int, std::string>{1, "none"}, {3, "full"}}) {
    const std::string name = lt::strcat("membf16_", zero, recompute);
    const auto r = run_mpi(2, job.train_args(name, 2, 4) + model + lt::strcat(" --device cpu --precision bf16 --zero ",
                                                                             zero, " --recompute ", recompute), kThreads);
    if (r.status != 0 && r.err.find("has no bf16 matrix products for this CPU's ISA") != std::string::npos)
      GTEST_SKIP() << r.err;
    ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
    const auto mem = job.metrics(name, "memory").at(0);
    const auto step = job.metrics(name, "step").at(1);
    const double table = mem["ranks"][0]["total_bytes"];
    const double measured = double(step["host_peak_rss_bytes"]) - double(mem["host_rss_before_model_bytes"]);
    std::printf("ZeRO %d, recompute %s, bf16: table %.1f MiB (bf16 copies %.1f MiB), measured %.1f MiB (%.3f)\n", zero,
                recompute.c_str(), table / 1048576, double(step["host_bf16_copy_peak_bytes"]) / 1048576,
                measured / 1048576, measured / table);
    EXPECT_GE(measured, 0.95 * table) << name;
    EXPECT_LE(measured, 1.05 * table + 32.0 * 1048576) << name << ": more than oneDNN's run-time state over the table";
  }
}

TEST(DataParallel, TestDataHasUnevenLossTokens) {
  const Job job(scratch_dir());
  const lt::Dataset ds = lt::Dataset::load(job.data);
  lt::DataOrder order(ds.train.n_seq, 7, true);
  int64_t tokens[2] = {0, 0};
  for (int i = 0; i < 12; ++i) {
    const uint8_t* m = ds.train.row_mask(order.row(0, i));
    for (int t = 1; t <= ds.info.seq_len; ++t) tokens[i < 4 ? 0 : 1] += m[t];
  }
  const double per_seq0 = tokens[0] / 4.0, per_seq1 = tokens[1] / 8.0;
  std::printf("loss tokens per sequence, first step: rank 0 %.2f, rank 1 %.2f\n", per_seq0, per_seq1);
  EXPECT_GT(std::abs(per_seq0 - per_seq1), 0.01 * std::max(per_seq0, per_seq1));
}

// auto: rank 1 made 3x slower; the split moves work to rank 0 and the losses do not change. With
// ZeRO 2 and 3 (per-micro-batch collectives on the CPU) the compute time the balancer compares
// leaves out the waits inside those collectives, or both ranks would look equally slow.
TEST(DataParallel, AutoBalanceMovesWorkOffASlowRank) {
  const Job job(scratch_dir());
  const auto ref = run_cli(job.train_args("one", 8), kThreads);
  ASSERT_EQ(ref.status, 0) << ref.err;
  for (const std::string stage : {"2", "3"}) {
    const std::string name = "auto" + stage;
    const auto r = run_mpi(2, job.train_args(name, 8) + " --zero " + stage +
                                  " --balance auto --rebalance-every 2 --simulate-slowdown 1=3", kThreads);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("SIMULATED slowdown: rank 1"), std::string::npos) << r.err;
    const auto rebalances = job.metrics(name, "rebalance");
    ASSERT_GE(rebalances.size(), 1u) << "ZeRO " << stage << "\n" << r.err;
    EXPECT_EQ(rebalances[0]["from"], nlohmann::json({3, 3}));
    const std::vector<int> to = rebalances[0]["to"];
    EXPECT_GE(to[0], 4) << rebalances[0].dump();  // ideal 4.5 / 1.5 for a 3x slower rank 1
    const auto steps = job.metrics(name, "step");
    const auto& last = steps.back();
    EXPECT_GE(last["split"][0].get<int>(), 4) << "ZeRO " << stage;
    EXPECT_EQ(last["rank_compute_ms"].size(), 2u);
    EXPECT_EQ(last["rank_wait_ms"].size(), 2u);
    expect_same_training(job, "one", name);
  }
}

// Errors every rank sees alike: one message, from rank 0, and a non-zero status.
TEST(DataParallel, BadOptionsAreReportedOnce) {
  const Job job(scratch_dir());
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--balance static", "train: --balance static needs --rank-weights w0,w1,... (one per rank)"},
      {"--balance static --rank-weights 1,2,3", "--rank-weights 1,2,3: 3 weights for 2 ranks; give one per rank"},
      {"--simulate-slowdown 2=3", "--simulate-slowdown 2=3: rank 2 is not in [0, 2)"},
      {"--zero 4", "--zero 4: expected an integer in [0, 3]"},
      {"--grad-reduce-dtype fp16", "--grad-reduce-dtype: fp16 not in {fp32,bf16}"},
  };
  for (const Case& c : cases) {
    const auto r = run_mpi(2, job.train_args("bad", 2) + " " + c.flags);
    EXPECT_NE(r.status, 0) << c.flags;
    const std::string line = "llamatrain train: error: " + c.message + "\n";
    const size_t at = r.err.find(line);
    EXPECT_NE(at, std::string::npos) << c.flags << "\n" << r.err;
    if (at != std::string::npos) EXPECT_EQ(r.err.find(line, at + 1), std::string::npos) << "reported twice:\n" << r.err;
  }
  // A global batch that is not whole micro-batches.
  const auto r = run_mpi(2, job.train_args("bad", 2, 5));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--global-batch 5 is not a multiple of --batch-size 2"), std::string::npos) << r.err;
}

// SIGKILL one rank in the middle of a run: mpirun notices and ends the job with a non-zero status
// well within 30 s; no rank is left waiting.
TEST(DataParallel, KilledRankEndsTheJob) {
  const Job job(scratch_dir());
  const std::string cmd = "exec " + lt::testing::mpirun_llamatrain(2) + job.train_args("killed", 100000) + " >'" +
                          (job.dir / "killed.out").string() + "' 2>'" + (job.dir / "killed.err").string() + "'";
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  using Clock = std::chrono::steady_clock;
  // Wait for a few steps, then find rank 1 by its environment.
  const auto t0 = Clock::now();
  pid_t victim = -1;
  while (victim < 0 && Clock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (job.metrics("killed", "step").size() < 3) continue;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string env = lt::testing::slurp(e.path().string() + "/environ");
      const std::string cmdline = lt::testing::slurp(e.path().string() + "/cmdline");
      if (cmdline.find((job.dir / "killed").string()) == std::string::npos) continue;
      if (env.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos) victim = std::stoi(name);
    }
  }
  ASSERT_GT(victim, 0) << "rank 1 not found\n" << lt::testing::slurp((job.dir / "killed.err").string());
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto t_kill = Clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 && Clock::now() - t_kill < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double took = std::chrono::duration<double>(Clock::now() - t_kill).count();
  if (done == 0) {  // still running: clean up before failing
    kill(-launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "mpirun still running 30 s after rank 1 was killed";
  }
  std::printf("mpirun ended %.2f s after SIGKILL of rank 1 (pid %d)\n", took, int(victim));
  EXPECT_TRUE(!WIFEXITED(status) || WEXITSTATUS(status) != 0) << "mpirun exited 0";
  EXPECT_LT(took, 30.0);
  // The launcher names the rank that died.
  const std::string err = lt::testing::slurp((job.dir / "killed.err").string());
  EXPECT_NE(err.find("process rank 1"), std::string::npos) << err;
  // No rank is left behind.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string cmdline = lt::testing::slurp(e.path().string() + "/cmdline");
    EXPECT_EQ(cmdline.find((job.dir / "killed").string()), std::string::npos) << "left running: " << e.path();
  }
}

}  // namespace

namespace {

// A checkpoint written by 2 ranks resumes on 2 (bit-identical), 1, 3 and 4 ranks, with ZeRO 1, 2
// and 3 (the same losses within fp32 reduction-order noise); one written by 3 ranks with ZeRO 3
// resumes on 2 with ZeRO 1 (every stage writes the same flat shards).
TEST(CheckpointMpi, ResumesOnAnyRankCount) {
  const Job job(scratch_dir());
  const std::string ck = (job.dir / "ck").string();
  const auto a = run_mpi(2, job.train_args("two", 6) + " --zero 1 --checkpoint-dir '" + ck +
                                "' --checkpoint-every 3 --keep-last 0");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_TRUE(std::filesystem::exists(ck + "/step-00000003/rank-00001.h5"));
  const auto ref = job.losses("two");
  ASSERT_EQ(ref.size(), 6u);
  struct Case {
    int np, zero;
    std::string name;
  };
  for (const Case& c : {Case{2, 1, "again2"}, Case{1, 1, "on1"}, Case{3, 2, "on3"}, Case{3, 1, "on3z1"},
                        Case{4, 3, "on4z3"}}) {
    const auto r = run_mpi(c.np, job.train_args(c.name, 6) + " --zero " + std::to_string(c.zero) + " --resume '" + ck +
                                     "/step-00000003'");
    ASSERT_EQ(r.status, 0) << c.name << "\n" << r.err;
    EXPECT_NE(r.err.find("resumed from " + ck + "/step-00000003 at step 3 (written by 2 rank(s)"), std::string::npos)
        << r.err;
    const auto l = job.losses(c.name);
    ASSERT_EQ(l.size(), 3u) << c.name;
    for (size_t i = 0; i < 3; ++i) {
      if (c.name == "again2") EXPECT_EQ(l[i], ref[i + 3]) << "step " << i + 4 << " not bit-identical";
      else EXPECT_NEAR(l[i], ref[i + 3], 1e-5 * ref[i + 3]) << c.name << " step " << i + 4;
    }
    std::printf("[ %s ] np %d ZeRO %d: losses of steps 4-6 %.9g %.9g %.9g (2 ranks straight: %.9g %.9g %.9g)\n",
                c.name.c_str(), c.np, c.zero, l[0], l[1], l[2], ref[3], ref[4], ref[5]);
  }
  // And back: ZeRO 3 on 3 ranks, checkpointed, continued by 2 ranks with ZeRO 1.
  const std::string ck3 = (job.dir / "ck3").string();
  const auto z3 = run_mpi(3, job.train_args("z3", 6) + " --zero 3 --checkpoint-dir '" + ck3 +
                                 "' --checkpoint-every 3 --keep-last 0");
  ASSERT_EQ(z3.status, 0) << z3.err;
  const auto r = run_mpi(2, job.train_args("z3on2z1", 6) + " --zero 1 --resume '" + ck3 + "/step-00000003'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("(written by 3 rank(s) with ZeRO stage 3)"), std::string::npos) << r.err;
  const auto l3 = job.losses("z3"), l = job.losses("z3on2z1");
  ASSERT_EQ(l3.size(), 6u);
  ASSERT_EQ(l.size(), 3u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(l3[i], ref[i], 1e-5 * ref[i]) << "ZeRO 3 on 3 ranks, step " << i + 1;
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(l[i], ref[i + 3], 1e-5 * ref[i + 3]) << "z3on2z1 step " << i + 4;
  std::printf("[ z3on2z1 ] losses of steps 4-6 %.9g %.9g %.9g\n", l[0], l[1], l[2]);
}

// LoRA (issue 36): a checkpoint of the adapters written by 2 ranks with ZeRO 1 resumes on 2
// (bit-identical), 1 (ZeRO 0), 3 ranks and 2 with ZeRO 3 (the base sharded): the adapters' shards
// are flat ranges as a model's are, and the base is --init-from's whatever the stage.
TEST(CheckpointMpi, LoraResumesOnAnyRankCount) {
  const Job job(scratch_dir());
  const auto base = run_cli(job.train_args("base", 2), kThreads);
  ASSERT_EQ(base.status, 0) << base.err;
  auto args = [&](const std::string& name) { return lora_args(job, name, 6); };
  const std::string ck = (job.dir / "ck").string();
  const auto a = run_mpi(2, args("two") + " --zero 1 --checkpoint-dir '" + ck + "' --checkpoint-every 3 --keep-last 0",
                         kThreads);
  ASSERT_EQ(a.status, 0) << a.err;
  const auto ref = job.losses("two");
  ASSERT_EQ(ref.size(), 6u);
  for (const auto& [np, zero, name] : std::vector<std::tuple<int, int, std::string>>{
           {2, 1, "again2"}, {1, 0, "on1z0"}, {3, 1, "on3"}, {2, 3, "on2z3"}}) {
    const auto r = run_mpi(np, args(name) + " --zero " + std::to_string(zero) + " --resume '" + ck + "/step-00000003'",
                           kThreads);
    ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
    const auto l = job.losses(name);
    ASSERT_EQ(l.size(), 3u) << name;
    for (size_t i = 0; i < 3; ++i) {
      if (name == "again2") EXPECT_EQ(l[i], ref[i + 3]) << "step " << i + 4 << " not bit-identical";
      else EXPECT_NEAR(l[i], ref[i + 3], 1e-5 * ref[i + 3]) << name << " step " << i + 4;
    }
    std::printf("[ %s ] LoRA, np %d ZeRO %d: losses of steps 4-6 %.9g %.9g %.9g (2 ranks straight: %.9g %.9g %.9g)\n",
                name.c_str(), np, zero, l[0], l[1], l[2], ref[3], ref[4], ref[5]);
  }
}

// train --keep-best on 2 ranks with ZeRO 3, where no rank holds the whole weights: the best step's
// checkpoint (a shard file per rank) is the one ck/best names, kept past --keep-last 1, and
// out/best.h5, streamed from the shards, holds its weights; eval on either gives the run's lowest
// test loss within 1e-6 relative (the ranks summed it in another order). As in the one-process test
// (Checkpoint.KeepBestKeepsTheLowestEvalLossThroughPruningAndResume) a learning rate warming up to
// 0.3 disturbs the model and lets it settle, so the lowest test loss comes before the last step.
TEST(CheckpointMpi, KeepBestOnTwoRanksWithZero3) {
  const Job job(scratch_dir());
  const std::string ck = (job.dir / "ck").string(), out = (job.dir / "out").string();
  const auto r = run_mpi(2, "train --model-config tiny --data '" + job.data + "' --batch-size 2 --global-batch 8 " +
                                "--max-steps 16 --lr 0.3 --warmup-steps 12 --seed 5 --no-progress --zero 3 " +
                                "--eval-every 2 --keep-best --keep-last 1 --checkpoint-dir '" + ck + "' --output '" +
                                out + "' --metrics '" + (job.dir / "kb.jsonl").string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  int64_t best_step = -1;
  double best_loss = 0;
  for (const auto& j : job.metrics("kb", "eval")) {
    std::printf("step %lld: test loss %.6f\n", static_cast<long long>(j["step"].get<int64_t>()),
                j["test_loss"].get<double>());
    if (best_step < 0 || j["test_loss"].get<double>() < best_loss)
      best_step = j["step"].get<int64_t>(), best_loss = j["test_loss"].get<double>();
  }
  ASSERT_GT(best_step, 0);
  EXPECT_LT(best_step, 16) << "the scenario needs the lowest test loss before the last step";
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(best_step));
  std::ifstream marker(ck + "/best");
  std::string named;
  std::getline(marker, named);
  EXPECT_EQ(named, name);
  EXPECT_TRUE(std::filesystem::exists(ck + "/" + name + "/rank-00001.h5"));
  std::set<std::string> left;
  for (const std::string& path : lt::list_checkpoints(ck)) left.insert(std::filesystem::path(path).filename().string());
  EXPECT_EQ(left, (std::set<std::string>{name, "step-00000016"}));
  const lt::ModelData kept = lt::load_model(ck + "/best"), best_h5 = lt::load_model(out + "/best.h5");
  ASSERT_EQ(kept.params.size(), best_h5.params.size());
  EXPECT_EQ(std::memcmp(kept.params.data(), best_h5.params.data(), kept.params.size() * sizeof(float)), 0);
  EXPECT_EQ(best_h5.training->steps, best_step);
  for (const std::string& model : {ck + "/best", out + "/best.h5"}) {
    const auto e = run_cli("eval --model '" + model + "' --data '" + job.data + "' --split test --batch-size 2 --json "
                           "--no-progress");
    ASSERT_EQ(e.status, 0) << e.err;
    EXPECT_NEAR(nlohmann::json::parse(e.out)["loss"].get<double>(), best_loss, 1e-6 * best_loss) << model;
  }
}

// The simulator's streams (kernels/sim/stream_sim.h) run each rank's queued work in the order
// LT_SIM_STREAM_ORDER picks: 3 ranks with ZeRO 2, whose gradient buckets are reduced on the
// collective stream while backward continues, and with ZeRO 3, whose gathers (the next block's
// issued while the current one computes) and gradient reductions all run on the collective stream
// with the compute stream waiting on events (2 steps, one micro-batch per rank; a bucket per block),
// give the same bits in the reverse and a seeded random order as in program order (forward). A bad
// value stops the run, which shows that the variable reaches the ranks.
TEST(CudaSimTraining, BitIdenticalInEveryStreamOrder) {
  const Job job(scratch_dir());
  auto run_in = [&](const std::string& order, const std::string& name, int zero) {
    return lt::testing::run_captured("env LT_SIM_STREAM_ORDER=" + order + " " + lt::testing::mpirun_llamatrain(3) +
                                     job.train_args(name, 2, 6) + lt::strcat(" --device cuda-sim --bucket-mb 0 --zero ", zero));
  };
  for (int zero : {2, 3}) {
    const std::string fwd_name = lt::strcat("forward", zero);
    const auto fwd = run_in("forward", fwd_name, zero);
    ASSERT_EQ(fwd.status, 0) << fwd.err;
    const auto ref = job.losses(fwd_name);
    const auto w_ref = job.weights(fwd_name);
    ASSERT_EQ(ref.size(), 2u);
    for (const std::string order : {"reverse", "random:20261204"}) {
      const std::string name = lt::strcat(order.substr(0, order.find(':')), zero);
      const auto r = run_in(order, name, zero);
      ASSERT_EQ(r.status, 0) << order << "\n" << r.err;
      const auto l = job.losses(name);
      std::printf("[ %s ] cuda-sim np 3 ZeRO %d: losses %.9g %.9g (forward: %.9g %.9g)\n", order.c_str(), zero,
                  l.at(0), l.at(1), ref[0], ref[1]);
      EXPECT_EQ(l, ref) << order << ", ZeRO " << zero;
      const auto w = job.weights(name);
      ASSERT_EQ(w.size(), w_ref.size());
      size_t differ = 0;
      for (size_t i = 0; i < w.size(); ++i) differ += w[i] != w_ref[i];
      EXPECT_EQ(differ, 0u) << order << ", ZeRO " << zero << ": final weights differ in " << differ << " of "
                            << w.size();
    }
  }
  const auto bad = run_in("sideways", "bad", 2);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("LT_SIM_STREAM_ORDER: 'sideways', expected forward, reverse or random:SEED"),
            std::string::npos) << bad.err;
}

// The same on --device cuda-sim, whose optimizer state lives on the device: the checkpoint is
// copied from the device shards, and a resume loads it back there (or, with --offload-optimizer,
// keeps it on the host: a ZeRO 2 checkpoint continued at ZeRO 3 with the optimizer offloaded).
TEST(CheckpointMpi, CudaSimResumesBitIdenticallyAndOnAnotherRankCount) {
  // 3 steps, resumed after the 2nd. (By a 4th step an Adam update of a near-zero gradient whose
  // sign the summation order decides moves some weights by 1e-5-4e-5 relative (tensor L2) between
  // rank counts and stages, ZeRO 0 and 1 alike; measured 2026-12-02.)
  const int steps = 3;
  const Job job(scratch_dir());
  const std::string ck = (job.dir / "ck").string();
  const auto a = run_mpi(2, job.train_args("two", steps) + " --device cuda-sim --zero 2 --checkpoint-dir '" + ck +
                                "' --checkpoint-every 2 --keep-last 0");
  ASSERT_EQ(a.status, 0) << a.err;
  const auto ref = job.losses("two");
  ASSERT_EQ(ref.size(), size_t(steps));
  struct Case {
    int np, zero;
    std::string name;
  };
  for (const Case& c : {Case{2, 2, "again2"}, Case{3, 1, "on3"}, Case{2, 3, "offload"}}) {
    const std::string offload = c.name == "offload" ? " --offload-optimizer" : "";
    const auto r = run_mpi(c.np, job.train_args(c.name, steps) + " --device cuda-sim --zero " +
                                     std::to_string(c.zero) + offload + " --resume '" + ck + "/step-00000002'");
    ASSERT_EQ(r.status, 0) << c.name << "\n" << r.err;
    EXPECT_NE(r.err.find("resumed from " + ck + "/step-00000002 at step 2"), std::string::npos) << r.err;
    const auto l = job.losses(c.name);
    ASSERT_EQ(l.size(), size_t(steps - 2)) << c.name;
    std::printf("[ %s ] cuda-sim np %d ZeRO %d: loss of step 3 %.9g (2 ranks straight: %.9g)\n", c.name.c_str(), c.np,
                c.zero, l[0], ref[2]);
    for (size_t i = 0; i < l.size(); ++i) {
      if (c.name == "again2") EXPECT_EQ(l[i], ref[i + 2]) << "step " << i + 3 << " not bit-identical";
      else EXPECT_NEAR(l[i], ref[i + 2], 1e-5 * ref[i + 2]) << c.name << " step " << i + 3;
    }
  }
  const auto w_ref = job.weights("two"), w_again = job.weights("again2");
  ASSERT_EQ(w_ref.size(), w_again.size());
  size_t differ = 0;
  for (size_t i = 0; i < w_ref.size(); ++i) differ += w_ref[i] != w_again[i];
  EXPECT_EQ(differ, 0u) << "final weights after a same-rank-count resume differ in " << differ << " of " << w_ref.size();
  expect_same_weights(job, "two", "on3");
  expect_same_weights(job, "two", "offload");
}

}  // namespace

namespace {

// SIGUSR1 to mpirun (Slurm's --signal=USR1@T, or by hand): Open MPI forwards it to every rank,
// which checkpoint the same step together and exit with status 3.
TEST(CheckpointMpi, Sigusr1ToMpirunCheckpointsAndExits3) {
  const Job job(scratch_dir());
  const std::string ck = (job.dir / "ck").string();
  const std::string cmd = "exec " + lt::testing::mpirun_llamatrain(2) + job.train_args("sig", 100000) +
                          " --checkpoint-dir '" + ck + "' 2>'" + (job.dir / "sig.err").string() + "'";
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (job.metrics("sig", "step").size() < 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(kill(launcher, SIGUSR1), 0);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(90))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "mpirun did not end after SIGUSR1";
  }
  const std::string err = lt::testing::slurp((job.dir / "sig.err").string());
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 3) << err;
  EXPECT_NE(err.find("stop signal: checkpoint of step"), std::string::npos) << err;
  EXPECT_TRUE(std::filesystem::exists(ck + "/latest")) << err;
  const std::string latest = lt::testing::slurp(ck + "/latest");
  EXPECT_TRUE(std::filesystem::exists(ck + "/" + latest.substr(0, latest.size() - 1) + "/rank-00001.h5")) << latest;
}

}  // namespace
