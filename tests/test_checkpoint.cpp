// Checkpoints of one process: exact resume, the named tensors through checkpoint.h5's virtual
// datasets, damage detection, signals, a kill during a write, and the refusals. Multi-rank
// resharding is in tests/mpi/test_train_mpi.cpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "llamatrain/builtin_qa.h"
#include "llamatrain/checkpoint.h"
#include "llamatrain/config.h"
#include "llamatrain/h5.h"
#include "llamatrain/h5_attrs.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "ckpt_edit.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using lt::testing::run_cli;
using lt::testing::scratch_dir;
using lt::testing::slurp;

TEST(Checksum64, DeterministicAndSensitiveToEveryBit) {
  std::vector<unsigned char> buf(1003);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7 + 3);
  const uint64_t h = lt::checksum64(buf.data(), buf.size());
  EXPECT_EQ(h, lt::checksum64(buf.data(), buf.size()));
  int same = 0;
  for (size_t i = 0; i < buf.size(); i += 37)
    for (int bit = 0; bit < 8; bit += 3) {
      buf[i] ^= static_cast<unsigned char>(1 << bit);
      same += lt::checksum64(buf.data(), buf.size()) == h;
      buf[i] ^= static_cast<unsigned char>(1 << bit);
    }
  EXPECT_EQ(same, 0);
  EXPECT_NE(lt::checksum64(buf.data(), 1002), h);  // the length counts
  EXPECT_NE(lt::checksum64(nullptr, 0), lt::checksum64(buf.data(), 1));
}

struct CkRun {
  fs::path dir;
  std::string data;
  explicit CkRun(const fs::path& d) : dir(d), data((d / "qa.h5").string()) {
    const std::string jsonl = (d / "qa.jsonl").string();
    std::ofstream(jsonl) << lt::builtin_qa_jsonl(400, 11);
    const auto r = run_cli("prepare --qa '" + jsonl + "' --prompt-type 3 --vocab-size 512 --seq-len 64 --test-split 0.1 " +
                           "--seed 1 --output '" + data + "'");
    EXPECT_EQ(r.status, 0) << r.err;
  }
  std::string args(const std::string& name, int steps, const std::string& ckpt_dir) const {
    return "train --model-config tiny --data '" + data + "' --batch-size 2 --global-batch 8 --max-steps " +
           std::to_string(steps) + " --lr 3e-3 --warmup-steps 2 --seed 5 --no-progress --metrics '" +
           (dir / (name + ".jsonl")).string() + "' --output '" + (dir / name).string() + "' --checkpoint-dir '" +
           ckpt_dir + "'";
  }
  std::vector<nlohmann::json> steps(const std::string& name) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir / (name + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "step") out.push_back(j);
    }
    return out;
  }
};

// Bit-identical: N steps straight == K steps, a checkpoint, a resume, N-K steps.
TEST(Checkpoint, ResumeIsBitIdentical) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  const auto a = run_cli(run.args("straight", 8, ck) + " --checkpoint-every 3 --keep-last 0");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_TRUE(fs::exists(ck + "/step-00000003/checkpoint.h5"));
  ASSERT_TRUE(fs::exists(ck + "/step-00000006/rank-00000.h5"));
  EXPECT_EQ(slurp(ck + "/latest"), "step-00000008\n");  // the last step ends the (only) epoch
  const auto b = run_cli(run.args("resumed", 8, (run.dir / "ck2").string()) + " --resume '" + ck + "/step-00000003'");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.err.find("resumed from " + ck + "/step-00000003 at step 3"), std::string::npos) << b.err;
  EXPECT_EQ(b.err.find("schedule changes"), std::string::npos) << b.err;  // the same total steps
  const auto sa = run.steps("straight"), sb = run.steps("resumed");
  ASSERT_EQ(sa.size(), 8u);
  ASSERT_EQ(sb.size(), 5u);
  for (size_t i = 0; i < sb.size(); ++i) {
    EXPECT_EQ(sb[i]["step"], sa[i + 3]["step"]);
    // Doubles print as their shortest exact form: equal text is equal bits.
    EXPECT_EQ(sb[i]["loss"].dump(), sa[i + 3]["loss"].dump()) << "step " << sb[i]["step"];
    EXPECT_EQ(sb[i]["grad_norm"].dump(), sa[i + 3]["grad_norm"].dump()) << "step " << sb[i]["step"];
  }
  const auto wa = lt::load_model((run.dir / "straight/model.h5").string()).params;
  const auto wb = lt::load_model((run.dir / "resumed/model.h5").string()).params;
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0) << "final weights differ";
}

// LoRA (issue 36): a checkpoint holds the adapters, their Adam state and the base's identity; the
// resume is bit-identical, dropout included; a checkpoint of the other kind or of another base is
// refused, and so is a LoRA checkpoint given as a model.
TEST(Checkpoint, LoraResumeIsBitIdenticalAndChecksTheBase) {
  const CkRun run(scratch_dir());
  const auto b0 = run_cli(run.args("base", 4, (run.dir / "ck0").string()));
  ASSERT_EQ(b0.status, 0) << b0.err;
  const std::string base = (run.dir / "base" / "model.h5").string();
  auto lora_args = [&](const std::string& name, const std::string& ck, const std::string& from) {
    std::string a = run.args(name, 8, ck);
    a.erase(a.find("--model-config tiny "), 20);
    return a + " --init-from '" + from + "' --lora-rank 4 --lora-alpha 8 --lora-dropout 0.1 --lora-targets wq,wv,w2";
  };
  const std::string ck = (run.dir / "ck").string();
  const auto a = run_cli(lora_args("straight", ck, base) + " --checkpoint-every 3 --keep-last 0");
  ASSERT_EQ(a.status, 0) << a.err;
  const lt::CheckpointInfo ci = lt::read_checkpoint_info(ck + "/step-00000003");
  EXPECT_NE(ci.lora.find("rank 4, alpha 8, dropout 0.1, targets wq,wv,w2; base sha256 "), std::string::npos) << ci.lora;
  const auto b = run_cli(lora_args("resumed", (run.dir / "ck2").string(), base) + " --resume '" + ck + "/step-00000003'");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.err.find("resumed from " + ck + "/step-00000003 at step 3"), std::string::npos) << b.err;
  const auto sa = run.steps("straight"), sb = run.steps("resumed");
  ASSERT_EQ(sa.size(), 8u);
  ASSERT_EQ(sb.size(), 5u);
  for (size_t i = 0; i < sb.size(); ++i) {
    EXPECT_EQ(sb[i]["loss"].dump(), sa[i + 3]["loss"].dump()) << "step " << sb[i]["step"];
    EXPECT_EQ(sb[i]["grad_norm"].dump(), sa[i + 3]["grad_norm"].dump()) << "step " << sb[i]["step"];
  }
  const auto wa = lt::load_model((run.dir / "straight/model.h5").string()).params;
  const auto wb = lt::load_model((run.dir / "resumed/model.h5").string()).params;
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0) << "final weights differ";
  const std::string adapter = slurp((run.dir / "straight/adapter/adapter_model.safetensors").string());
  EXPECT_EQ(adapter, slurp((run.dir / "resumed/adapter/adapter_model.safetensors").string()));
  // A rerun of the finished run whose outputs were lost writes both again from the last checkpoint.
  fs::remove_all(run.dir / "straight/adapter");
  fs::remove(run.dir / "straight/model.h5");
  const auto again = run_cli(lora_args("straight", ck, base) + " --checkpoint-every 3 --keep-last 0");
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.err.find("already complete"), std::string::npos) << again.err;
  EXPECT_EQ(slurp((run.dir / "straight/adapter/adapter_model.safetensors").string()), adapter);
  const auto wc = lt::load_model((run.dir / "straight/model.h5").string()).params;
  EXPECT_EQ(std::memcmp(wa.data(), wc.data(), wa.size() * sizeof(float)), 0) << "model.h5 written again differs";

  const std::string step3 = " --resume '" + ck + "/step-00000003'";
  std::string full = run.args("full", 8, (run.dir / "ck3").string());
  full.erase(full.find("--model-config tiny "), 20);
  const auto f = run_cli(full + " --init-from '" + base + "'" + step3);
  EXPECT_NE(f.status, 0);
  EXPECT_NE(f.err.find("a checkpoint of a LoRA run (rank 4"), std::string::npos) << f.err;
  const auto o = run_cli(lora_args("other", (run.dir / "ck4").string(), (run.dir / "straight/model.h5").string()) + step3);
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.err.find("a checkpoint of other LoRA adapters or another base"), std::string::npos) << o.err;
  const auto e = run_cli("eval --model '" + ck + "/step-00000003' --data '" + run.data + "'");
  EXPECT_NE(e.status, 0);
  EXPECT_NE(e.err.find("a checkpoint of a LoRA run"), std::string::npos) << e.err;
}

// A rerun of a finished run (what a Slurm requeue loop does after the last step) exits 0, says the
// run is already complete, trains nothing and leaves the final model and the metrics as they are;
// a final model that is missing (the run died after its last checkpoint) is written from the
// checkpoint. A checkpoint past the run's end is still an error.
TEST(Checkpoint, RerunOfAFinishedRunIsAlreadyComplete) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string(), model = (run.dir / "r/model.h5").string();
  const auto a = run_cli(run.args("r", 4, ck));
  ASSERT_EQ(a.status, 0) << a.err;
  const auto written = fs::last_write_time(model);
  const std::string metrics = slurp((run.dir / "r.jsonl").string());
  const auto weights = lt::load_model(model).params;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a rewrite would change the time

  const auto b = run_cli(run.args("r", 4, ck));
  EXPECT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.err.find(ck + "/step-00000004 is at step 4 of 4: the run is already complete"), std::string::npos)
      << b.err;
  EXPECT_EQ(b.err.find("steps in"), std::string::npos) << b.err;
  EXPECT_EQ(fs::last_write_time(model), written);
  EXPECT_EQ(slurp((run.dir / "r.jsonl").string()), metrics);

  fs::remove(model);
  const auto c = run_cli(run.args("r", 4, ck));
  EXPECT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.err.find("already complete"), std::string::npos) << c.err;
  const auto again = lt::load_model(model).params;
  ASSERT_EQ(again.size(), weights.size());
  EXPECT_EQ(std::memcmp(again.data(), weights.data(), weights.size() * sizeof(float)), 0);

  const auto d = run_cli(run.args("r", 3, ck));
  EXPECT_NE(d.status, 0);
  EXPECT_NE(d.err.find("nothing left to do"), std::string::npos) << d.err;
}

// Resuming with more steps than the checkpoint's run stretches the cosine decay; the console
// says so (old and new total steps, where the decay now ends).
TEST(Checkpoint, ResumeWithMoreStepsSaysHowTheScheduleChanges) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  const auto a = run_cli(run.args("a", 4, ck));
  ASSERT_EQ(a.status, 0) << a.err;
  const auto b = run_cli(run.args("b", 6, ck));
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.err.find("the learning-rate schedule changes at step 4: 4 -> 6 total steps"), std::string::npos)
      << b.err;
  EXPECT_NE(b.err.find("now ends at step 6 instead of 4"), std::string::npos) << b.err;
  EXPECT_EQ(run.steps("b").size(), 2u);
}

// checkpoint.h5 names every tensor with its shape (virtual datasets over the rank files).
TEST(Checkpoint, TensorsReadByNameThroughTheMasterFile) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  const auto a = run_cli(run.args("m", 4, ck));
  ASSERT_EQ(a.status, 0) << a.err;
  const auto model = lt::load_model((run.dir / "m/model.h5").string());
  const lt::ParameterLayout layout(model.config);
  const auto f = lt::h5::File::open_read(ck + "/step-00000004/checkpoint.h5");
  EXPECT_EQ(f.read_attr_int("/", "step"), 4);
  EXPECT_EQ(lt::read_model_config_attrs(f, "/").to_string(), model.config.to_string());
  for (const auto& t : layout.tensors()) {
    const auto shape = f.shape("/weights/" + t.name);
    ASSERT_EQ(shape.size(), t.shape.size()) << t.name;
    for (size_t d = 0; d < shape.size(); ++d) EXPECT_EQ(shape[d], uint64_t(t.shape[d])) << t.name;
    const auto w = f.read<float>("/weights/" + t.name);
    ASSERT_EQ(w.size(), t.numel);
    EXPECT_EQ(std::memcmp(w.data(), model.params.data() + t.offset, t.numel * sizeof(float)), 0) << t.name;
    const auto m = f.read<float>("/adam_m/" + t.name);
    double norm = 0;
    for (float x : m) norm += double(x) * x;
    EXPECT_GT(norm, 0) << "Adam m of " << t.name << " is all zero";
  }
}

// Flip one byte inside the newest checkpoint's weight data: detected, reported, skipped.
TEST(Checkpoint, DamagedCheckpointIsSkipped) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  ASSERT_EQ(run_cli(run.args("a", 6, ck) + " --checkpoint-every 3").status, 0);
  const std::string victim = ck + "/step-00000006/rank-00000.h5";
  // Find the weight bytes in the file by content and flip one in the middle.
  const auto w = lt::h5::File::open_read(victim).read<float>("/weights");
  std::string bytes = slurp(victim);
  const std::string needle(reinterpret_cast<const char*>(w.data() + 1000), 64);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 20] = static_cast<char>(bytes[at + 20] ^ 0x10);
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  const auto r = run_cli(run.args("b", 8, ck));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("skipping damaged checkpoint " + ck + "/step-00000006"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch in weights"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed from " + ck + "/step-00000003 at step 3"), std::string::npos) << r.err;
  // Named explicitly, the damaged one is an error, not a silent fallback.
  const auto e = run_cli(run.args("c", 8, (run.dir / "ck3").string()) + " --resume '" + ck + "/step-00000006'");
  EXPECT_NE(e.status, 0);
  EXPECT_NE(e.err.find("checksum mismatch"), std::string::npos) << e.err;
}

pid_t spawn(const std::string& cmd) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int wait_status(pid_t pid, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// SIGTERM (what Slurm sends at the time limit): a checkpoint of the current step, exit status 3.
TEST(Checkpoint, SigtermWritesACheckpointAndExitsWithStatus3) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  const pid_t pid = spawn(std::string("'") + LLAMATRAIN_BINARY + "' " + run.args("t", 100000, ck) + " 2>'" +
                          (run.dir / "t.err").string() + "'");
  while (run.steps("t").size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(wait_status(pid, 60), 3) << slurp((run.dir / "t.err").string());
  const std::string err = slurp((run.dir / "t.err").string());
  EXPECT_NE(err.find("stop signal: checkpoint of step"), std::string::npos) << err;
  const auto list = lt::list_checkpoints(ck);
  ASSERT_EQ(list.size(), 1u);
  const auto info = lt::read_checkpoint_info(list[0]);
  EXPECT_GE(info.step, 3);
  EXPECT_EQ(slurp(ck + "/latest"), fs::path(list[0]).filename().string() + "\n");
  // And it resumes from there.
  const auto r = run_cli(run.args("t2", int(info.step) + 2, ck));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from " + list[0]), std::string::npos) << r.err;
}

// SIGKILL while a checkpoint is being written: the previous one is the newest, and used.
TEST(Checkpoint, KillDuringWriteLosesNothingBeforeThePreviousCheckpoint) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  // Each write pauses 1.5 s before closing its file, so the kill lands inside one.
  const pid_t pid = spawn("env LLAMATRAIN_TEST_CHECKPOINT_DELAY_MS=1500 '" + std::string(LLAMATRAIN_BINARY) + "' " +
                          run.args("k", 100000, ck) + " --checkpoint-every 2 2>'" + (run.dir / "k.err").string() + "'");
  // Wait for step-2 to be published and the write of step 4 to be under way.
  const auto t0 = std::chrono::steady_clock::now();
  while (!(fs::exists(ck + "/step-00000002") && fs::exists(ck + "/.step-00000004.tmp")) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(ck + "/.step-00000004.tmp")) << slurp((run.dir / "k.err").string());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  wait_status(pid, 30);
  EXPECT_FALSE(fs::exists(ck + "/step-00000004"));
  EXPECT_EQ(slurp(ck + "/latest"), "step-00000002\n");
  const auto r = run_cli(run.args("k2", 5, ck));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from " + ck + "/step-00000002 at step 2"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(ck + "/.step-00000004.tmp")) << "the partial checkpoint is cleaned up";
  EXPECT_EQ(run.steps("k2").front()["step"], 3);
}

// Whether `dir`'s file system takes a 4096-byte O_DIRECT write (tmpfs and some network file systems
// do not).
bool direct_io_works(const fs::path& dir) {
  const std::string probe = (dir / "direct_probe").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  bool ok = false;
  if (fd >= 0) {
    void* block = std::aligned_alloc(4096, 4096);
    std::memset(block, 1, 4096);
    ok = ::pwrite(fd, block, 4096, 0) == 4096;
    std::free(block);
    ::close(fd);
  }
  fs::remove(probe);
  return ok;
}

// Offset of `needle` in the file's bytes (npos when absent).
size_t find_bytes(const std::string& path, const void* needle, size_t n) {
  return slurp(path).find(std::string(static_cast<const char*>(needle), n));
}

void flip_byte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(std::streamoff(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
}

// The arrays of a rank file are written with O_DIRECT from the snapshot into storage HDF5 reserved;
// forced through the page cache (LLAMATRAIN_CHECKPOINT_BUFFERED=1) the same state must load as the
// same bytes, by name through checkpoint.h5 too, and the checksums must catch a flipped byte in the
// directly written body and in the tail (the last partial block, written buffered). The snapshot
// is taken before wait_snapshot() returns.
TEST(Checkpoint, DirectAndBufferedWritesLoadTheSameBytes) {
  // On the build directory's disk (where the benchmark writes), not /tmp, which may be a tmpfs.
  const fs::path dir = fs::path(LLAMATRAIN_BINARY).parent_path() / ("test_ckpt_direct_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const lt::Llama2Config cfg = lt::preset_config("tiny");
  const lt::ParameterLayout layout(cfg);
  const size_t n = layout.total();
  ASSERT_NE(n * sizeof(float) % 4096, 0u) << "the arrays should end in a partial block, to test the tail";
  const unsigned seed = 20261130;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> params(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) params[i] = normal(rng), m[i] = normal(rng) * 1e-3f, v[i] = std::abs(normal(rng)) * 1e-6f;
  lt::CheckpointInfo info;
  info.step = 7;
  info.model_config = cfg.to_string();
  info.split = {4};
  lt::ShardView view;
  view.params = params.data(), view.m = m.data(), view.v = v.data(), view.begin = 0, view.end = n;

  auto write = [&](const std::string& ck, bool buffered) {
    if (buffered) ::setenv("LLAMATRAIN_CHECKPOINT_BUFFERED", "1", 1);
    else ::unsetenv("LLAMATRAIN_CHECKPOINT_BUFFERED");
    lt::CheckpointWriter w(ck, 0, 1, 0);
    w.start(info, layout, view, "");
    // The snapshot is copied in the background; once wait_snapshot() returned the state may
    // change (as the optimizer update does) and the checkpoint must still hold the state at start().
    EXPECT_GE(w.wait_snapshot(), 0.0);
    const std::vector<float> keep_p = params, keep_m = m, keep_v = v;
    std::fill(params.begin(), params.end(), -7.f), std::fill(m.begin(), m.end(), -7.f), std::fill(v.begin(), v.end(), -7.f);
    EXPECT_EQ(w.wait(), lt::CheckpointWriter::kWritten) << w.error();
    params = keep_p, m = keep_m, v = keep_v;
    w.publish({0}, {n}, true);
    ::unsetenv("LLAMATRAIN_CHECKPOINT_BUFFERED");
    EXPECT_EQ(w.last_bytes(), 3 * n * sizeof(float));
    return w.last_io();
  };
  const std::string ck_direct = (dir / "direct").string(), ck_buffered = (dir / "buffered").string();
  const std::string io_direct = write(ck_direct, false), io_buffered = write(ck_buffered, true);
  if (direct_io_works(dir)) {
    EXPECT_EQ(io_direct, "direct");
  } else {
    std::printf("note: %s takes no O_DIRECT writes; the default path fell back: %s\n", dir.c_str(), io_direct.c_str());
    EXPECT_EQ(io_direct.rfind("buffered (O_DIRECT", 0), 0u) << io_direct;
  }
  EXPECT_EQ(io_buffered, "buffered (LLAMATRAIN_CHECKPOINT_BUFFERED is set)");

  const std::vector<float>* want[3] = {&params, &m, &v};
  for (const std::string& ck : {ck_direct, ck_buffered}) {
    const std::string step = ck + "/step-00000007";
    std::vector<float> p2(n, -1.f), m2(n, -1.f), v2(n, -1.f);
    lt::load_checkpoint_state(step, layout, p2.data(), 0, n, m2.data(), v2.data());
    EXPECT_EQ(std::memcmp(p2.data(), params.data(), n * sizeof(float)), 0) << ck;
    EXPECT_EQ(std::memcmp(m2.data(), m.data(), n * sizeof(float)), 0) << ck;
    EXPECT_EQ(std::memcmp(v2.data(), v.data(), n * sizeof(float)), 0) << ck;
    const auto f = lt::h5::File::open_read(step + "/checkpoint.h5");
    for (const auto& t : layout.tensors()) {
      const auto w = f.read<float>("/weights/" + t.name);
      ASSERT_EQ(w.size(), t.numel) << t.name;
      EXPECT_EQ(std::memcmp(w.data(), params.data() + t.offset, t.numel * sizeof(float)), 0) << ck << " " << t.name;
    }
    // Each array starts on a block boundary of the rank file (what O_DIRECT needs), in both modes.
    for (int a = 0; a < 3; ++a) {
      const size_t at = find_bytes(step + "/rank-00000.h5", want[a]->data(), 256);
      ASSERT_NE(at, std::string::npos) << ck << " array " << a;
      EXPECT_EQ(at % 4096, 0u) << ck << " array " << a << " at " << at;
    }
  }

  // Damage in the directly written body (the middle of adam_m) and in the buffered tail (the last
  // element of adam_v): both named by the checksum check, the rest of the file left as it was.
  const std::string step = ck_direct + "/step-00000007", rank_file = step + "/rank-00000.h5";
  const size_t m_at = find_bytes(rank_file, m.data(), 256), v_at = find_bytes(rank_file, v.data(), 256);
  ASSERT_NE(m_at, std::string::npos);
  ASSERT_NE(v_at, std::string::npos);
  std::vector<float> p2(n), m2(n), v2(n);
  const size_t body_byte = m_at + n * sizeof(float) / 2, tail_byte = v_at + n * sizeof(float) - 2;
  ASSERT_GE(tail_byte - v_at, n * sizeof(float) / 4096 * 4096) << "the flipped byte must lie in the tail";
  flip_byte(rank_file, body_byte);
  EXPECT_NE(lt::testing::error_of([&] { lt::load_checkpoint_state(step, layout, p2.data(), 0, n, m2.data(), v2.data()); })
                .find("checksum mismatch in adam_m"),
            std::string::npos);
  flip_byte(rank_file, body_byte);
  flip_byte(rank_file, tail_byte);
  EXPECT_NE(lt::testing::error_of([&] { lt::load_checkpoint_state(step, layout, p2.data(), 0, n, m2.data(), v2.data()); })
                .find("checksum mismatch in adam_v"),
            std::string::npos);
  flip_byte(rank_file, tail_byte);
  EXPECT_EQ(lt::testing::error_of([&] { lt::load_checkpoint_state(step, layout, p2.data(), 0, n, m2.data(), v2.data()); }),
            "<no error>");
  std::printf("seed %u, %zu parameters, %zu bytes per array (%zu in the tail), io: %s / %s\n", seed, n,
              n * sizeof(float), n * sizeof(float) % 4096, io_direct.c_str(), io_buffered.c_str());
  fs::remove_all(dir);
}

TEST(Checkpoint, RefusesAnotherModelTokenizerOrDataset) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  ASSERT_EQ(run_cli(run.args("a", 2, ck)).status, 0);
  // Another model shape.
  auto r = run_cli(run.args("b", 4, ck) + " --dim 32");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("a checkpoint of another model"), std::string::npos) << r.err;
  // Other data with the same tokenizer: refused unless --allow-new-data.
  const std::string other_jsonl = (run.dir / "other.jsonl").string(), other = (run.dir / "other.h5").string();
  std::ofstream(other_jsonl) << lt::builtin_qa_jsonl(300, 99);
  ASSERT_EQ(run_cli("prepare --qa '" + other_jsonl + "' --prompt-type 3 --tokenizer '" + (run.dir / "qa.model").string() +
                    "' --seq-len 64 --test-split 0.1 --seed 1 --output '" + other + "'")
                .status,
            0);
  std::string args = run.args("c", 4, ck);
  args.replace(args.find(run.data), run.data.size(), other);
  r = run_cli(args);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("written while training on other data"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--allow-new-data"), std::string::npos) << r.err;
  r = run_cli(args + " --allow-new-data");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from"), std::string::npos) << r.err;
  // Another tokenizer (same vocabulary size, trained on other text).
  const std::string third = (run.dir / "third.h5").string();
  ASSERT_EQ(run_cli("prepare --qa '" + other_jsonl + "' --prompt-type 3 --vocab-size 512 --seq-len 64 --test-split 0.1 " +
                    "--seed 1 --output '" + third + "'")
                .status,
            0);
  args = run.args("d", 4, ck);
  args.replace(args.find(run.data), run.data.size(), third);
  r = run_cli(args + " --allow-new-data");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("written with another tokenizer"), std::string::npos) << r.err;
}

// train --keep-best (issue 35, point 8). A learning rate warming up to 0.08 over the whole run with
// a weight decay of 32 first trains the tiny model and then, as the decoupled decay (lr x 32 of each
// weight per step) grows, shrinks its weights towards zero: the test loss (every 2 steps) falls to
// its lowest inside the run and rises again (measured 5.582 5.045 4.815 4.509 4.448 4.626 5.210
// 7.624, the same to 3 decimals with OPENBLAS_CORETYPE unset, Sandybridge and Prescott: the decay
// is a contraction, where the chaos of a large learning rate alone turned on the BLAS kernel's last
// bits). The run keeps that step S: ck/best names step-S, which pruning skips, its
// checkpoint.h5 and every later one record S and its loss, out/best.h5 holds the same weights
// (out/model.h5 the last step's), and eval on ck/best and on out/best.h5 gives that loss (1e-6
// relative). A rerun resumed after S (the later checkpoints removed, as by a crash) goes on comparing
// with S's loss: no later step becomes the best, and --keep-last 1 then keeps step-S and the newest.
TEST(Checkpoint, KeepBestKeepsTheLowestEvalLossThroughPruningAndResume) {
  const fs::path dir = scratch_dir();
  const std::string data = (dir / "qa.h5").string(), ck = (dir / "ck").string(), ck2 = (dir / "ck2").string();
  ASSERT_EQ(run_cli("prepare --qa builtin:factqa:400 --prompt-type 3 --vocab-size 512 --seq-len 64 --test-split 0.1 "
                    "--seed 1 --output '" + data + "'").status, 0);
  auto train = [&](const std::string& name, const std::string& ck_dir, const std::string& extra) {
    return lt::testing::run_captured(
        "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 '" + std::string(LLAMATRAIN_BINARY) + "' train --model-config tiny " +
        "--data '" + data + "' --batch-size 2 --global-batch 8 --max-steps 16 --lr 0.08 --warmup-steps 16 " +
        "--weight-decay 32 --seed 5 " +
        "--no-progress --eval-every 2 --keep-best --metrics '" + (dir / (name + ".jsonl")).string() + "' --output '" +
        (dir / name).string() + "' --checkpoint-dir '" + ck_dir + "' " + extra);
  };
  // The (step, test loss) of the eval records, and the steps of the best records.
  auto records = [&](const std::string& name, std::vector<std::pair<int64_t, double>>* evals,
                     std::vector<int64_t>* bests) {
    std::ifstream in(dir / (name + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "eval") evals->emplace_back(j["step"].get<int64_t>(), j["test_loss"].get<double>());
      if (j["type"] == "best") bests->push_back(j["step"].get<int64_t>());
    }
  };
  auto step_dir = [](int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
    return std::string(buf);
  };

  const auto a = train("a", ck, "--checkpoint-every 2 --keep-last 0");
  ASSERT_EQ(a.status, 0) << a.err;
  std::vector<std::pair<int64_t, double>> evals;
  std::vector<int64_t> bests;
  records("a", &evals, &bests);
  ASSERT_EQ(evals.size(), 8u);
  std::pair<int64_t, double> best = evals[0];
  for (const auto& e : evals) {
    std::printf("step %lld: test loss %.6f\n", static_cast<long long>(e.first), e.second);
    if (e.second < best.second) best = e;
  }
  ASSERT_LT(best.first, 14) << "the scenario needs the lowest test loss before the last two evaluations";
  ASSERT_FALSE(bests.empty());
  EXPECT_EQ(bests.back(), best.first);
  const std::string best_name = step_dir(best.first);
  EXPECT_EQ(slurp(ck + "/best"), best_name + "\n");
  EXPECT_EQ(slurp(ck + "/latest"), "step-00000016\n");
  for (const std::string& name : {best_name, std::string("step-00000016")}) {
    const lt::CheckpointInfo ci = lt::read_checkpoint_info(ck + "/" + name);
    EXPECT_EQ(ci.best_eval_step, best.first) << name;
    EXPECT_EQ(ci.best_eval_loss, best.second) << name;
  }
  const lt::ModelData kept = lt::load_model(ck + "/best"), best_h5 = lt::load_model((dir / "a/best.h5").string());
  EXPECT_EQ(kept.source, ck + "/" + best_name);
  ASSERT_TRUE(best_h5.training.has_value());
  EXPECT_EQ(best_h5.training->steps, best.first);
  EXPECT_EQ(best_h5.training->eval_loss, best.second);
  EXPECT_EQ(lt::load_model((dir / "a/model.h5").string()).training->steps, 16);
  ASSERT_EQ(kept.params.size(), best_h5.params.size());
  EXPECT_EQ(std::memcmp(kept.params.data(), best_h5.params.data(), kept.params.size() * sizeof(float)), 0);
  for (const std::string& model : {ck + "/best", (dir / "a/best.h5").string()}) {
    const auto e = run_cli("eval --model '" + model + "' --data '" + data + "' --split test --batch-size 2 --json "
                           "--no-progress", 1);
    ASSERT_EQ(e.status, 0) << e.err;
    EXPECT_NEAR(nlohmann::json::parse(e.out)["loss"].get<double>(), best.second, 1e-6 * best.second) << model;
  }

  // Resumed after the best: ck2 holds ck's checkpoints up to step best + 2, b a's outputs.
  const int64_t resume_at = best.first + 2;
  fs::copy(ck, ck2, fs::copy_options::recursive);
  fs::copy(dir / "a", dir / "b", fs::copy_options::recursive);
  for (const std::string& path : lt::list_checkpoints(ck2))
    if (std::atoll(fs::path(path).filename().c_str() + 5) > resume_at) fs::remove_all(path);
  std::ofstream(ck2 + "/latest") << step_dir(resume_at) << "\n";
  const auto b = train("b", ck2, "--keep-last 1");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.err.find("resumed from " + ck2 + "/" + step_dir(resume_at)), std::string::npos) << b.err;
  std::vector<std::pair<int64_t, double>> evals_b;
  std::vector<int64_t> bests_b;
  records("b", &evals_b, &bests_b);
  const std::vector<std::pair<int64_t, double>> evals_after(evals.begin() + resume_at / 2, evals.end());
  EXPECT_EQ(evals_b, evals_after);
  EXPECT_TRUE(bests_b.empty()) << "step " << bests_b.front() << " taken for the best after the resume";
  EXPECT_EQ(slurp(ck2 + "/best"), best_name + "\n");
  std::set<std::string> left;
  for (const std::string& path : lt::list_checkpoints(ck2)) left.insert(fs::path(path).filename().string());
  EXPECT_EQ(left, (std::set<std::string>{best_name, "step-00000016"}));
  EXPECT_EQ(lt::read_checkpoint_info(ck2 + "/step-00000016").best_eval_step, best.first);
  EXPECT_EQ(lt::load_model((dir / "b/best.h5").string()).training->steps, best.first);
}

// Issue 14 §5: model.h5 and every checkpoint.h5 record how the run trained, in one /training
// group written by one function; the checkpoint's lists are lists and its model config numbers.
TEST(Checkpoint, TrainingIsRecordedInTheModelAndTheCheckpoint) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string();
  const double t0 = double(std::time(nullptr));
  const auto a = run_cli(run.args("m", 4, ck) + " --eval-every 2");
  ASSERT_EQ(a.status, 0) << a.err;
  const double t1 = double(std::time(nullptr)) + 1;
  const auto steps = run.steps("m");
  ASSERT_EQ(steps.size(), 4u);
  const auto data = lt::h5::File::open_read(run.data);
  const auto model = lt::h5::File::open_read((run.dir / "m/model.h5").string());
  const auto master = lt::h5::File::open_read(ck + "/step-00000004/checkpoint.h5");
  for (const auto* f : {&model, &master}) {
    SCOPED_TRACE(f->path());
    const lt::TrainingRecord r = lt::read_training_record(*f, "/training");
    EXPECT_EQ(r.tool_version, LLAMATRAIN_VERSION);
    EXPECT_EQ(r.command_line.rfind(std::string(LLAMATRAIN_BINARY) + " train --model-config tiny --data ", 0), 0u)
        << r.command_line;
    EXPECT_EQ(r.data_path, run.data);
    EXPECT_EQ(r.data_source_sha256, data.read_attr_string("/", "source_sha256"));
    EXPECT_EQ(r.data_tokenizer_sha256, data.read_attr_string("/", "tokenizer_sha256"));
    EXPECT_EQ(r.data_identity, master.read_attr_string("/", "data_identity"));
    EXPECT_EQ(r.steps, 4);
    EXPECT_EQ(r.total_steps, 4);
    EXPECT_EQ(r.epochs, 1);
    EXPECT_EQ(r.global_batch, 8);
    EXPECT_EQ(r.batch_size, 2);
    EXPECT_EQ(f->read_attr_double("/training", "lr"), 3e-3);  // the decimal given, not float(3e-3)
    EXPECT_EQ(r.warmup_steps, 2);
    EXPECT_EQ(r.seed, 5u);
    EXPECT_EQ(r.world_size, 1);
    EXPECT_EQ(r.zero_stage, 1);
    EXPECT_EQ(r.train_loss, steps[3]["loss"].get<double>());
    EXPECT_TRUE(std::isfinite(r.eval_loss) && r.eval_loss > 0) << r.eval_loss;
    EXPECT_GE(r.unix_time_s, t0);
    EXPECT_LE(r.unix_time_s, t1);
    EXPECT_EQ(f->read_attr_double("/", "norm_eps"), 1e-5);
  }
  EXPECT_EQ(master.read_attr_int("/", "format_version"), 3);
  EXPECT_EQ(master.read_attr_ints("/", "split"), (std::vector<int64_t>{4}));
  EXPECT_EQ(master.read_attr_strings("/", "rank_files"), (std::vector<std::string>{"rank-00000.h5"}));
  const lt::ParameterLayout layout(lt::read_model_config_attrs(master, "/"));
  EXPECT_EQ(master.read_attr_ints("/", "rank_begin"), (std::vector<int64_t>{0}));
  EXPECT_EQ(master.read_attr_ints("/", "rank_end"), (std::vector<int64_t>{int64_t(layout.total())}));
}

// A checkpoint.h5 of format 1 (model config, split, rank files and training options as strings)
// still loads as a model and resumes, its learning-rate schedule read from the JSON. Its rank file
// has the checksum64 piece sums of formats 1 and 2, and no checksums.xxh3 lists the files.
TEST(Checkpoint, ReadsTheVersion1MasterFile) {
  const CkRun run(scratch_dir());
  const std::string ck = (run.dir / "ck").string(), step = ck + "/step-00000004";
  ASSERT_EQ(run_cli(run.args("a", 4, ck)).status, 0);
  const auto before = lt::load_model(step);
  lt::testing::use_checksum64(step + "/rank-00000.h5");
  fs::remove(step + "/checksums.xxh3");
  std::string tokenizer_sha, identity;
  {
    const auto f = lt::h5::File::open_read(step + "/checkpoint.h5");
    tokenizer_sha = f.read_attr_string("/", "tokenizer_sha256");
    identity = f.read_attr_string("/", "data_identity");
  }
  const lt::ParameterLayout layout(before.config);
  {
    auto f = lt::h5::File::create(step + "/checkpoint.h5");
    f.write_attr("/", "format", std::string("llamatrain-checkpoint"));
    f.write_attr("/", "format_version", int64_t{1});
    f.write_attr("/", "step", int64_t{4});
    f.write_attr("/", "epoch", int64_t{0});
    f.write_attr("/", "world_size", int64_t{1});
    f.write_attr("/", "zero_stage", int64_t{1});
    f.write_attr("/", "seed", int64_t{5});
    f.write_attr("/", "global_batch", int64_t{8});
    f.write_attr("/", "split", std::string("4"));
    f.write_attr("/", "model_config", before.config.to_string());
    f.write_attr("/", "tokenizer_sha256", tokenizer_sha);
    f.write_attr("/", "data_identity", identity);
    f.write_attr("/", "train_config", std::string(R"({"lr":0.003,"min_lr":3e-05,"warmup_steps":2,"total_steps":4})"));
    f.write_attr("/", "rank_files", "rank-00000.h5 0 " + std::to_string(layout.total()));
    f.close();
  }
  const auto info = lt::read_checkpoint_info(step);
  EXPECT_EQ(info.split, (std::vector<int>{4}));
  EXPECT_EQ(info.model_config, before.config.to_string());
  EXPECT_EQ(info.training.total_steps, 4);
  const auto after = lt::load_model(step);
  ASSERT_EQ(after.params.size(), before.params.size());
  EXPECT_EQ(std::memcmp(after.params.data(), before.params.data(), before.params.size() * sizeof(float)), 0);
  const auto b = run_cli(run.args("b", 6, ck));
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.err.find("the learning-rate schedule changes at step 4: 4 -> 6 total steps"), std::string::npos)
      << b.err;
}

}  // namespace
