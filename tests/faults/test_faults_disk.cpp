// Failed writes never crash and never leave partial files (issue 15, item 1). Every subcommand that
// writes a file runs out of space mid-write in two ways: a file-size limit (`ulimit -f`; llamatrain
// ignores SIGXFSZ itself, so write() fails with EFBIG; works anywhere) and, where this process may mount one (root,
// as in CI), a real full file system (a small tmpfs: ENOSPC). Each must end with exit status 1 (train:
// 4, its final state not saved) and an error naming the file and the reason, with no signal, no
// temporary file and no output left.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "faults/fault_cases.h"
#include "test_util.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::run_captured;
using testing::run_cli;
using testing::scratch;

// Inputs made once, on a file system with room: a dataset and a trained tiny model.
struct Inputs {
  std::string data, model;
};
const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs r;
    r.data = scratch() + "/inputs/tales.h5";
    fs::create_directories(scratch() + "/inputs");
    auto p = run_cli("prepare --text builtin:tinytales --vocab-size 512 --seq-len 64 --seed 1 --output " + r.data);
    EXPECT_EQ(p.status, 0) << p.err;
    auto t = run_cli("train --model-config tiny --data " + r.data + " --max-steps 2 --no-progress --output " +
                     scratch() + "/inputs/run");
    EXPECT_EQ(t.status, 0) << t.err;
    r.model = scratch() + "/inputs/run/model.h5";
    return r;
  }();
  return in;
}

// The commands that write, each into `dir`.
std::vector<std::pair<std::string, std::string>> writers(const std::string& dir) {
  const Inputs& in = inputs();
  return {
      {"prepare", "prepare --text builtin:tinytales --vocab-size 512 --seq-len 64 --seed 1 --output " + dir + "/d.h5"},
      {"train", "train --model-config tiny --data " + in.data + " --max-steps 1 --no-progress --output " + dir + "/run"},
      {"convert to HF", "convert --input " + in.model + " --output " + dir + "/hf"},
      {"convert to llama2.c", "convert --input " + in.model + " --output " + dir + "/m.bin"},
  };
}

// Files under dir whose name marks a temporary, or any regular file at all when `nothing` is set.
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

void expect_clean_failure(const std::string& what, const CliResult& r, const std::string& dir,
                          const std::string& reason) {
  SCOPED_TRACE(what);
  // train ran its steps and could not save the final model: status 4, not 1 (docs/usage.md).
  const int status = what == "train" ? 4 : 1;
  EXPECT_EQ(r.status, status) << "status " << r.status << " (>128: killed by a signal)\n" << r.err;
  EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(reason), std::string::npos) << "the reason '" << reason << "' is not in:\n" << r.err;
  const std::vector<std::string> left = leftovers(dir);
  for (const std::string& f : left)
    ADD_FAILURE() << "left behind after a failed write: " << f << " (" << fs::file_size(f) << " bytes)";
  // For the suite's summary: a file left under its name is a wrong result, however clear the error.
  faults::Run run;
  run.status = r.status;
  run.err = r.err;
  faults::Outcome o = faults::classify_refusal(run, status, reason);
  if (o == faults::Outcome::kClear && !left.empty()) o = faults::Outcome::kSilentWrong;
  faults::record(what + ": " + reason, o, left.empty() ? faults::last_line(r.err) : "left behind: " + left[0]);
}

TEST(FaultsDisk, AFileSizeLimitEndsEveryWriterCleanly) {
  const Inputs& in = inputs();
  ASSERT_FALSE(in.model.empty());
  int n = 0;
  for (const auto& [what, args] : writers(scratch() + "/limited")) {
    const std::string dir = scratch() + "/limited";
    fs::remove_all(dir);
    fs::create_directories(dir);
    // 24 KiB: the tokenizer, the dataset, the model and the exports are all larger. SIGXFSZ keeps
    // its default action (it kills) here: llamatrain must ignore it itself.
    const CliResult r = run_captured("bash -c 'ulimit -f 24; exec \"$0\" \"$@\"' '" +
                                     std::string(LLAMATRAIN_BINARY) + "' " + args);
    expect_clean_failure(what, r, dir, "File too large");
    ++n;
  }
  std::printf("%d writers stopped by a 24 KiB file-size limit, each with status 1 (train 4) and nothing left\n", n);
}

TEST(FaultsDisk, AFullFileSystemEndsEveryWriterCleanly) {
  const Inputs& in = inputs();
  ASSERT_FALSE(in.model.empty());
  const std::string mnt = scratch() + "/tmpfs";
  fs::create_directories(mnt);
  if (::geteuid() != 0 || ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=96k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root); the file-size-limit test covers the same paths";
  int n = 0;
  for (const auto& [what, args] : writers(mnt)) {
    for (const auto& e : fs::directory_iterator(mnt)) fs::remove_all(e.path());
    const CliResult r = run_cli(args);
    expect_clean_failure(what, r, mnt, "No space left on device");
    ++n;
  }
  ::umount(mnt.c_str());
  std::printf("%d writers stopped by a full 96 KiB tmpfs, each with status 1 (train 4) and nothing left\n", n);
}

// Issue 37, item 9: a write that fails after others succeeded takes those back. prepare trained
// and wrote its tokenizer (d.model, d.vocab: 5 KB each, under the limit), then failed on the
// dataset; an HF export in shards wrote the first ones, then the disk was full.
TEST(FaultsDisk, AFailureAfterEarlierFilesTakesThemBack) {
  const Inputs& in = inputs();
  ASSERT_FALSE(in.model.empty());
  const std::string dir = scratch() + "/partial";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    // About 1 MB of words in a fixed pseudo-random order: a dataset of about 1 MB, a tokenizer of 5 KB.
    std::string text;
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park", "red", "ball"};
    uint32_t x = 1;
    for (int i = 0; i < 20000; ++i) {
      for (int w = 0; w < 12; ++w) {
        x = x * 1103515245u + 12345u;
        text += std::string(w ? " " : "") + words[(x >> 16) % 13];
      }
      text += ".\n";
    }
    std::ofstream(scratch() + "/partial-text.txt") << text;  // outside dir
  }
  const CliResult r = run_captured("bash -c 'ulimit -f 64; exec \"$0\" \"$@\"' '" + std::string(LLAMATRAIN_BINARY) +
                                   "' prepare --text " + scratch() + "/partial-text.txt --vocab-size 300 --seq-len 32 --output " +
                                   dir + "/d.h5");
  ASSERT_NE(r.err.find("training a bpe tokenizer"), std::string::npos) << "the tokenizer must be made before the failure\n" << r.err;
  expect_clean_failure("prepare, the tokenizer written before the dataset failed", r, dir, "File too large");

  const std::string mnt = scratch() + "/tmpfs-partial";
  fs::create_directories(mnt);
  if (::geteuid() != 0 || ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): the HF export's half is not run";
  const CliResult hf = run_cli("convert --input " + in.model + " --output " + mnt + "/hf --max-shard-size 60000");
  expect_clean_failure("convert to HF in shards, the disk full after the first ones", hf, mnt, "No space left on device");
  ::umount(mnt.c_str());
  EXPECT_NE(hf.err.find("-of-000"), std::string::npos) << "the export must fail at a shard:\n" << hf.err;
  EXPECT_EQ(hf.err.find("model-00001-of-"), std::string::npos) << "... and not at the first:\n" << hf.err;
}

}  // namespace
}  // namespace lt
