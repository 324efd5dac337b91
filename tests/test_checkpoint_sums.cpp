// Checkpoint checksums (format 3, docs/formats.md "Checksums"): XXH3 as `xxhsum -H3` computes it;
// checksums.xxh3, which lists every file and which `xxhsum -c` checks; everything a resume trusts
// covered by it and cross-checked between checkpoint.h5 and every rank file, so that an edited
// attribute makes the checkpoint damaged and the previous one is used; and format 2, the previous
// one, still loading with its own piece sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt_edit.h"
#include "llamatrain/builtin_qa.h"
#include "llamatrain/checkpoint.h"
#include "llamatrain/config.h"
#include "llamatrain/h5.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "test_util.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::run_captured;
using testing::run_cli;
using testing::scratch_dir;
using testing::slurp;

// 400 built-in question records, a tiny model, 8 sequences per step.
struct SmallRun {
  fs::path dir;
  std::string data;
  explicit SmallRun(const fs::path& d) : dir(d), data((d / "qa.h5").string()) {
    const std::string jsonl = (d / "qa.jsonl").string();
    std::ofstream(jsonl) << builtin_qa_jsonl(400, 11);
    const auto r = run_cli("prepare --qa '" + jsonl + "' --prompt-type 3 --vocab-size 512 --seq-len 64 --test-split 0.1 " +
                           "--seed 1 --output '" + data + "'");
    EXPECT_EQ(r.status, 0) << r.err;
  }
  // `steps` steps, a checkpoint every 3, all kept, the metrics in NAME.jsonl.
  testing::CliResult train(const std::string& name, int steps) const {
    return run_cli("train --model-config tiny --data '" + data + "' --batch-size 2 --global-batch 8 --max-steps " +
                   std::to_string(steps) + " --seed 5 --no-progress --checkpoint-every 3 --keep-last 0 --metrics '" +
                   (dir / (name + ".jsonl")).string() + "' --checkpoint-dir '" + ck() + "'");
  }
  std::string ck() const { return (dir / "ck").string(); }
  std::string step(int n) const {
    char name[32];
    std::snprintf(name, sizeof name, "/step-%08d", n);
    return ck() + name;
  }
};

std::string hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool have_xxhsum() { return run_captured("command -v xxhsum").status == 0; }

TEST(CheckpointSums, Xxh3IsTheStandardHash) {
  // What `printf '' | xxhsum -H3` and `printf abc | xxhsum -H3` print (xxHash 0.8).
  EXPECT_EQ(hex(xxh3_64("", 0)), "2d06800538d394c2");
  EXPECT_EQ(hex(xxh3_64("abc", 3)), "78af5f94892f3950");
  if (have_xxhsum()) EXPECT_NE(run_captured("sh -c 'printf abc | xxhsum -H3'").out.find("78af5f94892f3950"), std::string::npos);
}

// checksums.xxh3 has one line per file of the checkpoint, each the XXH3 of the file's bytes, and
// `xxhsum -c` (Debian's xxhash) checks them: OK as written, FAILED after a flipped byte.
TEST(CheckpointSums, ChecksumsFileListsEveryFileAndXxhsumChecksIt) {
  const SmallRun run(scratch_dir());
  ASSERT_EQ(run.train("a", 3).status, 0);
  const std::string step = run.step(3);
  std::ifstream in(step + "/checksums.xxh3");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(step))
    if (e.path().filename() != "checksums.xxh3") files.push_back(e.path().filename().string());
  ASSERT_EQ(lines.size(), files.size());
  EXPECT_EQ(lines[0].rfind("XXH3 (checkpoint.h5) = ", 0), 0u) << lines[0];
  for (const std::string& f : files) {
    const std::string bytes = slurp(step + "/" + f);
    const std::string want = "XXH3 (" + f + ") = " + hex(xxh3_64(bytes.data(), bytes.size()));
    EXPECT_NE(std::find(lines.begin(), lines.end(), want), lines.end()) << want;
  }
  if (!have_xxhsum()) {
    std::printf("note: no xxhsum here (Debian's xxhash, scripts/install-deps.sh); checked in-process only\n");
    return;
  }
  const auto ok = run_captured("cd '" + step + "' && xxhsum -c checksums.xxh3");
  EXPECT_EQ(ok.status, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("rank-00000.h5: OK"), std::string::npos) << ok.out;
  std::fstream f(step + "/rank-00000.h5", std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(std::streamoff(fs::file_size(step + "/rank-00000.h5") / 2));
  f.put('\x5a');
  f.close();
  const auto bad = run_captured("cd '" + step + "' && xxhsum -c checksums.xxh3");
  EXPECT_NE(bad.status, 0) << bad.out;
  EXPECT_NE(bad.out.find("rank-00000.h5: FAILED"), std::string::npos) << bad.out;
}

// The campaign's edit: checkpoint.h5's step attribute changed (6 -> 8). The checkpoint no longer
// matches its checksums.xxh3, so it is damaged: the resume says so, takes the previous checkpoint
// and trains from step 4, skipping nothing.
TEST(CheckpointSums, ATamperedStepFallsBackToThePreviousCheckpoint) {
  const SmallRun run(scratch_dir());
  ASSERT_EQ(run.train("a", 6).status, 0);
  testing::set_root_attr(run.step(6) + "/checkpoint.h5", "step", int64_t{8});
  EXPECT_EQ(read_checkpoint_info(run.step(3)).step, 3);
  const auto r = run.train("b", 9);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("skipping damaged checkpoint " + run.step(6) + ": "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checkpoint.h5: XXH3 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("differs from checksums.xxh3's"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed from " + run.step(3) + " at step 3"), std::string::npos) << r.err;
  std::ifstream in(run.dir / "b.jsonl");
  int64_t first_step = -1;
  for (std::string line; std::getline(in, line) && first_step < 0;) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") first_step = j["step"];
  }
  EXPECT_EQ(first_step, 4);
}

// Each attribute of the stamp edited in checkpoint.h5 and its checksums.xxh3 line brought up to
// date (so only the cross-check can tell): the rank file disagrees, and the load names both values.
TEST(CheckpointSums, EveryRankFileMustAgreeWithCheckpointH5) {
  const SmallRun run(scratch_dir());
  ASSERT_EQ(run.train("a", 3).status, 0);
  const CheckpointInfo info = read_checkpoint_info(run.step(3));
  const ParameterLayout layout(Llama2Config::from_string(info.model_config, "test"));
  std::vector<float> p(layout.total()), m(layout.total()), v(layout.total());
  auto load = [&](const std::string& step) {
    return error_of([&] { load_checkpoint_state(step, layout, p.data(), 0, layout.total(), m.data(), v.data()); });
  };
  ASSERT_EQ(load(run.step(3)), "<no error>");
  struct Edit {
    const char* attr;
    std::function<void(const std::string&)> apply;
    std::string there, here;
  };
  const std::vector<Edit> edits = {
      {"step", [](const std::string& f) { testing::set_root_attr(f, "step", int64_t{5}); }, "3", "5"},
      {"epoch", [](const std::string& f) { testing::set_root_attr(f, "epoch", int64_t{1}); }, "0", "1"},
      {"seed", [](const std::string& f) { testing::set_root_attr(f, "seed", int64_t{6}); }, "5", "6"},
      {"world_size", [](const std::string& f) { testing::set_root_attr(f, "world_size", int64_t{2}); }, "1", "2"},
      {"zero_stage", [](const std::string& f) { testing::set_root_attr(f, "zero_stage", int64_t{2}); }, "1", "2"},
      {"global_batch", [](const std::string& f) { testing::set_root_attr(f, "global_batch", int64_t{16}); }, "8", "16"},
      {"split", [](const std::string& f) { testing::set_root_attr(f, "split", std::vector<int64_t>{5}); }, "4", "5"},
      {"data_identity", [](const std::string& f) { testing::set_root_attr(f, "data_identity", std::string("x")); },
       info.data_identity, "x"},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.attr);
    const std::string copy = (run.dir / (std::string("edit-") + e.attr)).string();
    fs::copy(run.step(3), copy);
    e.apply(copy + "/checkpoint.h5");
    EXPECT_NE(load(copy).find("differs from checksums.xxh3's"), std::string::npos) << load(copy);
    testing::resum_in_manifest(copy, "checkpoint.h5");
    EXPECT_EQ(load(copy), copy + "/rank-00000.h5: " + e.attr + " is " + e.there + " there but " + e.here +
                              " in checkpoint.h5 (damaged checkpoint)");
  }
}

// A checkpoint of format 2 written by the previous release on 2 ranks (tests/fixtures/ckpt_v2):
// it loads as a model, the same tensors as its virtual datasets give, and its checksum64 piece sums
// are still checked: a flipped weight byte in the second rank file is damage.
TEST(CheckpointSums, ReadsTheVersion2Format) {
  const std::string step = (scratch_dir() / "step-00000002").string();
  fs::copy(std::string(LLAMATRAIN_SOURCE_DIR) + "/tests/fixtures/ckpt_v2/step-00000002", step);
  const CheckpointInfo info = read_checkpoint_info(step);
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.split, (std::vector<int>{1, 1}));
  EXPECT_FALSE(fs::exists(step + "/checksums.xxh3"));
  const ModelData model = load_model(step);
  const ParameterLayout layout(model.config);
  {
    const auto f = h5::File::open_read(step + "/checkpoint.h5");
    for (const auto& t : layout.tensors()) {
      const auto w = f.read<float>("/weights/" + t.name);
      ASSERT_EQ(w.size(), t.numel) << t.name;
      EXPECT_EQ(std::memcmp(w.data(), model.params.data() + t.offset, t.numel * sizeof(float)), 0) << t.name;
    }
  }
  const std::string rank1 = step + "/rank-00001.h5";
  const auto w = h5::File::open_read(rank1).read<float>("/weights");
  std::string bytes = slurp(rank1);
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(w.data() + w.size() / 2), 32));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] = static_cast<char>(bytes[at + 5] ^ 0x04);
  std::ofstream(rank1, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_NE(error_of([&] { load_model(step); }).find("rank-00001.h5: checksum mismatch in weights"), std::string::npos)
      << error_of([&] { load_model(step); });
}

}  // namespace
}  // namespace lt
