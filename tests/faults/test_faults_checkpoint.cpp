// Damaged and tampered checkpoints (issue 15, item 11): a table of damage to the newest checkpoint
// (weights, Adam moments, checksum tables, piece tables, metadata attributes, truncated or missing
// files, `latest`), each followed by `train --resume auto` (or eval, or an explicit --resume). Each
// must be detected: resume falls back to the previous good checkpoint, with a warning that names
// the damage, and the run then ends with exactly the weights of an uninterrupted run; or it is
// refused with status 1 and a clear message. Never a silent resume from damaged state.
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "faults/fault_cases.h"
#include "llamatrain/h5.h"
#include "llamatrain/model_io.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using faults::Outcome;

constexpr int kSteps = 8;

struct Base {
  std::string data, ckpt, model;  // the dataset, an 8-step run's checkpoints (2, 4, 6, 8), its model
};

std::string train_args(const std::string& data, const std::string& dir, const std::string& extra = "") {
  return "train --model-config tiny --vocab-size 300 --data " + data +
         " --batch-size 2 --global-batch 4 --max-steps " + std::to_string(kSteps) +
         " --lr 3e-3 --warmup-steps 2 --seed 5 --no-progress --checkpoint-every 2 --keep-last 0 --checkpoint-dir " +
         dir + "/ckpt --output " + dir + "/out " + extra;
}

// One thread: every run is the same computation, so a resume is bit-identical to the straight run.
faults::Run run1(const std::string& args) { return faults::run_tool("env OMP_NUM_THREADS=1 " + args, 120); }
faults::Run train1(const std::string& args) {
  return faults::run_limited("env OMP_NUM_THREADS=1 '" + std::string(LLAMATRAIN_BINARY) + "' " + args, 120);
}

const Base& base() {
  static const Base b = [] {
    Base r;
    const std::string dir = testing::scratch() + "/base";
    fs::create_directories(dir);
    r.data = dir + "/tales.h5";
    auto p = faults::run_tool("prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --test-split 0.02 "
                              "--seed 1 --output " + r.data);
    EXPECT_EQ(p.status, 0) << p.err;
    auto t = train1(train_args(r.data, dir));
    EXPECT_EQ(t.status, 0) << t.err;
    r.ckpt = dir + "/ckpt";
    r.model = dir + "/out/model.h5";
    return r;
  }();
  return b;
}

std::string step_dir(const std::string& ckpt, int step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/step-%08d", step);
  return ckpt + buf;
}

// A fresh copy of the base checkpoints without step 8: the run "died" after publishing step 6.
std::string fresh_copy(const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(base().ckpt, dir + "/ckpt", fs::copy_options::recursive);
  fs::remove_all(step_dir(dir + "/ckpt", 8));
  std::ofstream(dir + "/ckpt/latest", std::ios::trunc) << "step-00000006\n";
  return dir + "/ckpt";
}

// ---- damage -------------------------------------------------------------------------------

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(std::streamoff(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
}

// Flips a byte in the middle of a contiguous dataset's data.
void flip_dataset(const std::string& file, const std::string& dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0) << dataset;
  const haddr_t off = H5Dget_offset(d);
  const hsize_t size = H5Dget_storage_size(d);
  H5Dclose(d);
  H5Fclose(f);
  ASSERT_NE(off, HADDR_UNDEF) << dataset << " is not contiguous";
  flip_byte(file, off + size / 2);
}

void truncate_to(const std::string& path, double fraction) {
  fs::resize_file(path, uint64_t(double(fs::file_size(path)) * fraction));
}

// Overwrites an int64 attribute (scalar or list, same length) of an object in place.
void set_attr_ints(const std::string& file, const std::string& obj, const std::string& name,
                   const std::vector<int64_t>& values) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  const hid_t a = H5Aopen_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, values.data()), 0);
  H5Aclose(a);
  H5Fclose(f);
}

std::vector<int64_t> attr_ints(const std::string& file, const std::string& name) {
  return h5::File::open_read(file).read_attr_ints("/", name);
}

// Adds `delta` to element 0 of a uint64 dataset, in place.
void bump_dataset_u64(const std::string& file, const std::string& dataset, uint64_t delta) {
  auto values = h5::File::open_read(file).read<uint64_t>(dataset);
  ASSERT_FALSE(values.empty());
  values[0] += delta;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Dclose(d);
  H5Fclose(f);
}

// ---- the table ----------------------------------------------------------------------------

enum class Expect {
  kFallBack,   // status 0; warned about step 6 with `needle`; resumed from step 4; exact result
  kUseNewest,  // status 0; resumed from step 6 (the damage is in nothing a resume reads); exact
  kRefuse,     // status 1 with `needle`
  kLoadStep4,  // a model loader (convert): status 0, warned with `needle`, step 4's weights used
};

struct Case {
  std::string name;
  std::function<void(const std::string& ckpt)> damage;
  Expect expect;
  std::string needle;
  // A known gap, reported by this suite: the case fails until the fix named here lands.
  std::string known_gap;
  // The command; default `train --resume auto` on the damaged copy.
  std::function<std::string(const std::string& dir)> command;
};

std::vector<Case> cases() {
  const auto rank0 = [](const std::string& ck) { return step_dir(ck, 6) + "/rank-00000.h5"; };
  const auto master = [](const std::string& ck) { return step_dir(ck, 6) + "/checkpoint.h5"; };
  std::vector<Case> c = {
      {"weights: a byte flipped", [=](const std::string& ck) { flip_dataset(rank0(ck), "/weights"); },
       Expect::kFallBack, "checksum mismatch in weights"},
      {"Adam m: a byte flipped", [=](const std::string& ck) { flip_dataset(rank0(ck), "/adam_m"); },
       Expect::kFallBack, "checksum mismatch in adam_m"},
      {"Adam v: a byte flipped", [=](const std::string& ck) { flip_dataset(rank0(ck), "/adam_v"); },
       Expect::kFallBack, "checksum mismatch in adam_v"},
      {"checksum table: a byte flipped", [=](const std::string& ck) { flip_dataset(rank0(ck), "/checksum_adam_v"); },
       Expect::kFallBack, "checksum mismatch in adam_v"},
      {"piece table: an offset changed",
       [=](const std::string& ck) { bump_dataset_u64(rank0(ck), "/piece_offset", 1); }, Expect::kFallBack,
       "does not match the model's tensor"},
      {"rank file truncated to half", [=](const std::string& ck) { truncate_to(rank0(ck), 0.5); }, Expect::kFallBack,
       "rank-00000.h5"},
      {"rank file truncated to 100 bytes", [=](const std::string& ck) { fs::resize_file(rank0(ck), 100); },
       Expect::kFallBack, "rank-00000.h5"},
      {"rank file empty", [=](const std::string& ck) { fs::resize_file(rank0(ck), 0); }, Expect::kFallBack,
       "rank-00000.h5"},
      {"rank file missing", [=](const std::string& ck) { fs::remove(rank0(ck)); }, Expect::kFallBack,
       "rank-00000.h5"},
      {"checkpoint.h5 truncated to half", [=](const std::string& ck) { truncate_to(master(ck), 0.5); },
       Expect::kFallBack, "checkpoint.h5"},
      {"checkpoint.h5 missing", [=](const std::string& ck) { fs::remove(master(ck)); }, Expect::kFallBack,
       "not a checkpoint (no checkpoint.h5)"},
      {"metadata: format_version 99", [=](const std::string& ck) { set_attr_ints(master(ck), "/", "format_version", {99}); },
       Expect::kFallBack, "differs from checksums.xxh3"},
      {"metadata: rank_end shortened",
       [=](const std::string& ck) {
         auto e = attr_ints(master(ck), "rank_end");
         e.back() -= 1;
         set_attr_ints(master(ck), "/", "rank_end", e);
       },
       Expect::kFallBack, "differs from checksums.xxh3"},
      {"metadata: world_size 0", [=](const std::string& ck) { set_attr_ints(master(ck), "/", "world_size", {0}); },
       Expect::kFallBack, "differs from checksums.xxh3"},
      // Format 3 hashes checkpoint.h5 whole (checksums.xxh3), so any edit of its metadata, even one
      // a resume would otherwise take for another run (global batch, model shape), is damage.
      {"metadata: global_batch 99", [=](const std::string& ck) { set_attr_ints(master(ck), "/", "global_batch", {99}); },
       Expect::kFallBack, "differs from checksums.xxh3"},
      {"metadata: dim 32", [=](const std::string& ck) { set_attr_ints(master(ck), "/", "dim", {32}); },
       Expect::kFallBack, "differs from checksums.xxh3"},
      // Was a gap: a tampered step was believed (resume "at step 5" with step 6's weights and Adam
      // state). Now checkpoint.h5 is hashed, and its step checked against step-N and the rank files.
      {"metadata: step 6 -> 5 (was a gap)", [=](const std::string& ck) { set_attr_ints(master(ck), "/", "step", {5}); },
       Expect::kFallBack, "differs from checksums.xxh3", "a checksum over checkpoint.h5's metadata (or step checked against step-N and the rank files)"},
      // Was a gap: a rank file of another checkpoint (a mixed-up copy or restore) carries valid
      // checksums of its own; now checksums.xxh3 hashes every file of the checkpoint, and its run
      // stamp (step, world_size, ...) is compared with checkpoint.h5's.
      {"rank file of step 4 copied into step 6 (was a gap)",
       [=](const std::string& ck) {
         fs::copy_file(step_dir(ck, 4) + "/rank-00000.h5", rank0(ck), fs::copy_options::overwrite_existing);
       },
       Expect::kFallBack, "step is 4 there but 6 in checkpoint.h5", "the rank file's step (and world_size) compared with checkpoint.h5's"},
      // `latest` is a convenience for people and scripts; resume and the model loaders take the
      // newest complete step-N, so a damaged pointer costs nothing.
      {"latest: garbage bytes",
       [](const std::string& ck) { std::ofstream(ck + "/latest", std::ios::trunc) << std::string("\0\xff\x01junk", 7); },
       Expect::kUseNewest, ""},
      {"latest: names a missing step",
       [](const std::string& ck) { std::ofstream(ck + "/latest", std::ios::trunc) << "step-00000099\n"; },
       Expect::kUseNewest, ""},
      {"latest: missing", [](const std::string& ck) { fs::remove(ck + "/latest"); }, Expect::kUseNewest, ""},
      {"latest: names a partial step-10 (rank file only)",
       [=](const std::string& ck) {
         fs::create_directories(step_dir(ck, 10));
         fs::copy_file(rank0(ck), step_dir(ck, 10) + "/rank-00000.h5");
         std::ofstream(ck + "/latest", std::ios::trunc) << "step-00000010\n";
       },
       Expect::kUseNewest, "skipping damaged checkpoint"},
      {"every checkpoint damaged",
       [](const std::string& ck) {
         for (int s : {2, 4, 6}) flip_dataset(step_dir(ck, s) + "/rank-00000.h5", "/weights");
       },
       Expect::kRefuse, "are damaged (see above); move them away to start afresh"},
  };
  // Named explicitly, a damaged checkpoint is an error, never a fallback.
  Case named{"--resume step-6 named, weights flipped", [=](const std::string& ck) { flip_dataset(rank0(ck), "/weights"); },
             Expect::kRefuse, "checksum mismatch in weights"};
  named.command = [](const std::string& dir) {
    return train_args(base().data, dir, "--resume " + step_dir(dir + "/ckpt", 6));
  };
  c.push_back(named);
  // The model loaders (eval/generate/convert/train --init-from) share the checks.
  Case eval_named{"eval --model step-6, weights flipped", [=](const std::string& ck) { flip_dataset(rank0(ck), "/weights"); },
                  Expect::kRefuse, "checksum mismatch in weights"};
  eval_named.command = [](const std::string& dir) {
    return "eval --model " + step_dir(dir + "/ckpt", 6) + " --data " + base().data + " --split test --no-progress";
  };
  c.push_back(eval_named);
  Case eval_tok{"eval --model step-6, tokenizer flipped",
                [=](const std::string& ck) { flip_dataset(master(ck), "/tokenizer/model"); }, Expect::kRefuse,
                "checkpoint.h5: XXH3"};
  eval_tok.command = eval_named.command;
  c.push_back(eval_tok);
  Case convert_root{"convert --input DIR/latest, newest damaged",
                    [=](const std::string& ck) { flip_dataset(rank0(ck), "/adam_v"); flip_dataset(rank0(ck), "/weights"); },
                    Expect::kLoadStep4, "skipping damaged checkpoint"};
  convert_root.command = [](const std::string& dir) {
    return "convert --input " + dir + "/ckpt/latest --output " + dir + "/converted.h5";
  };
  c.push_back(convert_root);
  return c;
}

std::string resumed_from(const std::string& err) {
  const size_t at = err.find("resumed from ");
  if (at == std::string::npos) return "(started afresh)";
  return err.substr(at, err.find('\n', at) - at);
}

// Runs the cases with (`gaps`) or without a known gap, each on a fresh copy of the checkpoints.
void run_cases(bool gaps) {
  ASSERT_FALSE(base().data.empty());
  ASSERT_TRUE(fs::exists(step_dir(base().ckpt, 6) + "/checkpoint.h5"));
  const std::vector<float> want = load_model(base().model).params;
  std::vector<std::string> open_gaps;
  int n = 0;
  for (const Case& c : cases()) {
    if (c.known_gap.empty() == gaps) continue;
    SCOPED_TRACE(c.name);
    const std::string dir = testing::scratch() + "/case" + std::to_string(n++);
    const std::string ck = fresh_copy(dir);
    c.damage(ck);
    const std::string args = c.command ? c.command(dir) : train_args(base().data, dir);
    const faults::Run r = train1(args);
    Outcome o;
    std::string detail;
    if (c.expect == Expect::kLoadStep4) {
      // Falls back with a warning: the converted weights must be step 4's.
      const bool ok = r.status == 0 && r.err.find(c.needle) != std::string::npos &&
                      r.err.find("using checkpoint " + step_dir(ck, 4)) != std::string::npos;
      o = r.hung ? Outcome::kHang : r.status >= 128 ? Outcome::kCrash : ok ? Outcome::kClear : Outcome::kUnclear;
      if (ok) {
        const auto got = load_model(dir + "/converted.h5").params;
        const auto four = load_model(step_dir(ck, 4)).params;
        if (got != four) o = Outcome::kSilentWrong;
      }
      detail = faults::last_line(r.err);
    } else if (c.expect == Expect::kRefuse) {
      o = faults::classify_refusal(r, 1, c.needle);
      detail = faults::last_line(r.err);
    } else {
      const int from = c.expect == Expect::kFallBack ? 4 : 6;
      const bool resumed_right =
          r.err.find("resumed from " + step_dir(ck, from) + " at step " + std::to_string(from)) != std::string::npos;
      const bool warned = c.expect == Expect::kUseNewest && c.needle.empty()
                              ? true
                              : r.err.find("skipping damaged checkpoint") != std::string::npos &&
                                    r.err.find(c.needle) != std::string::npos;
      bool exact = false;
      if (r.status == 0 && fs::exists(dir + "/out/model.h5")) exact = load_model(dir + "/out/model.h5").params == want;
      if (r.hung) o = Outcome::kHang;
      else if (r.status >= 128) o = Outcome::kCrash;
      else if (r.status != 0) o = Outcome::kUnclear;
      else if (!resumed_right || !exact) o = Outcome::kSilentWrong;
      // The resumed run writes the damaged step's checkpoint again: it must be published (the
      // damaged directory moved aside), not dropped with a warning.
      else if (r.err.find("was not published") != std::string::npos) o = Outcome::kUnclear;
      else if (c.expect == Expect::kUseNewest && c.needle.empty()) o = Outcome::kRecovered;
      else o = warned ? Outcome::kClear : Outcome::kUnclear;
      detail = resumed_from(r.err) + (exact ? ", final weights exact" : ", final weights differ") + "; " +
               (r.err.find("skipping damaged") != std::string::npos
                    ? r.err.substr(r.err.find("skipping damaged"), 200)
                    : std::string("no warning"));
    }
    if (!c.known_gap.empty() && o != Outcome::kClear) {
      open_gaps.push_back(c.name + ": " + faults::outcome_name(o) + "; needs " + c.known_gap);
      detail = "KNOWN GAP, needs " + c.known_gap + ": " + detail;
    }
    faults::record("checkpoint: " + c.name, o, detail);
    std::printf("%-55s %-10s %s\n", c.name.c_str(), faults::outcome_name(o), detail.substr(0, 160).c_str());
    EXPECT_TRUE(o == Outcome::kClear || o == Outcome::kRecovered)
        << faults::outcome_name(o) << ", status " << r.status << "\n" << detail << "\n" << r.err.substr(0, 3000);
  }
  for (const auto& g : open_gaps) std::printf("KNOWN GAP (reported, not fixed here): %s\n", g.c_str());
}

TEST(FaultsCheckpoint, DamagedOrTamperedCheckpointsAreDetected) { run_cases(false); }

// Tampered metadata that nothing checked until the step checks of src/ckpt/checkpoint.cpp (the
// step attribute against the step-N directory name, every rank file's own step against
// checkpoint.h5's): found by this suite, kept as the test of that fix.
TEST(FaultsCheckpoint, TamperedStepOrMixedRankFileIsDetected) { run_cases(true); }

}  // namespace
}  // namespace lt
