// Model inputs of the CLI (issue 14 §4): a training checkpoint as --model/--input, the tokenizer
// check of fine-tuning for every model format, convert never replacing a foreign config.json,
// and eval's progress on stderr with its stdout unchanged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "llamatrain/builtin_corpus.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"

namespace lt {
namespace {

using testing::run_cli;
using testing::scratch;
using testing::slurp;
namespace fs = std::filesystem;

// Text from the embedded corpus, prepared with its own trained 512-piece tokenizer (DIR/NAME.model
// beside the dataset).
std::string prepare(const std::string& name, size_t from, size_t bytes) {
  const std::string text = scratch() + "/" + name + ".txt", out = scratch() + "/" + name + ".h5";
  if (file_exists(out)) return out;
  std::ofstream(text) << builtin_corpus().substr(from, bytes);
  auto r = run_cli("prepare --text " + text + " --vocab-size 512 --seq-len 32 --test-split 0.1 --output " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  return out;
}

// A tiny model trained 2 steps with a checkpoint after each: DIR/ck/step-00000001, -2, latest,
// and the final model DIR/out/model.h5 (the same weights as step 2).
struct Trained {
  std::string dir, data, ck, model;
};
const Trained& trained() {
  static const Trained t = [] {
    Trained r;
    r.dir = scratch() + "/trained";
    r.data = prepare("a", 0, 10000);
    r.ck = r.dir + "/ck";
    r.model = r.dir + "/out/model.h5";
    auto res = run_cli("train --model-config tiny --data " + r.data + " --batch-size 2 --global-batch 4 --max-steps 2 "
                       "--seed 3 --no-progress --checkpoint-every 1 --keep-last 0 --checkpoint-dir " + r.ck +
                       " --output " + r.dir + "/out");
    EXPECT_EQ(res.status, 0) << res.err;
    return r;
  }();
  return t;
}

std::string eval_json(const std::string& model, const std::string& extra = "") {
  auto r = run_cli("eval --model " + model + " --data " + trained().data + " --json --no-progress " + extra);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.out;
}

void flip_weight_byte(const std::string& rank_file) {
  const auto w = h5::File::open_read(rank_file).read<float>("/weights");
  std::string bytes = slurp(rank_file);
  const std::string needle(reinterpret_cast<const char*>(w.data() + w.size() / 2), 64);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 20] = static_cast<char>(bytes[at + 20] ^ 0x10);
  std::ofstream(rank_file, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CliModels, CheckpointIsAModelForEvalGenerateAndConvert) {
  const Trained& t = trained();
  const std::string step2 = t.ck + "/step-00000002";
  ASSERT_TRUE(file_exists(step2 + "/checkpoint.h5"));
  const std::string want = eval_json(t.model);
  // The step directory, its checkpoint.h5, the root and root/latest: the same weights as the final model.
  for (const std::string& m : {step2, step2 + "/checkpoint.h5", t.ck, t.ck + "/latest"})
    EXPECT_EQ(eval_json(m), want) << m;
  auto root = run_cli("eval --model " + t.ck + " --data " + t.data + " --json --no-progress");
  EXPECT_NE(root.err.find("using checkpoint " + step2), std::string::npos) << root.err;
  // The checkpoint carries its data's tokenizer: generate needs no --tokenizer.
  const std::string gen = " --prompt 'Once upon a time' --max-new-tokens 12 --temperature 0";
  auto g1 = run_cli("generate --model " + t.ck + gen), g2 = run_cli("generate --model " + t.model + gen);
  ASSERT_EQ(g1.status, 0) << g1.err;
  EXPECT_EQ(g1.out, g2.out);
  // convert: checkpoint -> HDF5 model with the same weights and the tokenizer inside.
  const std::string h5 = t.dir + "/from_ck.h5";
  auto c = run_cli("convert --input " + t.ck + "/step-00000001 --output " + h5);
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(eval_json(h5), eval_json(t.ck + "/step-00000001"));
  EXPECT_NE(eval_json(h5), want);  // step 1 is not step 2
  auto g3 = run_cli("generate --model " + h5 + gen);
  EXPECT_EQ(g3.status, 0) << g3.err;
}

TEST(CliModels, DamagedCheckpointIsAnErrorOrSkippedForTheRoot) {
  const Trained& t = trained();
  const std::string ck = t.dir + "/ck_damaged";
  fs::remove_all(ck);
  fs::copy(t.ck, ck, fs::copy_options::recursive);
  flip_weight_byte(ck + "/step-00000002/rank-00000.h5");
  // Named explicitly: an error naming the file.
  auto e = run_cli("eval --model " + ck + "/step-00000002 --data " + t.data + " --json");
  EXPECT_NE(e.status, 0);
  EXPECT_NE(e.err.find(ck + "/step-00000002/rank-00000.h5: checksum mismatch"), std::string::npos) << e.err;
  // The root: the previous valid one, saying so.
  auto r = run_cli("eval --model " + ck + " --data " + t.data + " --json --no-progress");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("skipping damaged checkpoint " + ck + "/step-00000002"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("using checkpoint " + ck + "/step-00000001"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, eval_json(t.ck + "/step-00000001"));
}

// A llama2.c .bin stores no tokenizer: fine-tuning it on data from another tokenizer is refused
// unless the model's tokenizer is given and matches the data's, or the mismatch is allowed.
TEST(CliModels, FineTuningABinModelChecksTheTokenizer) {
  const Trained& t = trained();
  const std::string bin = t.dir + "/model.bin";
  ASSERT_EQ(run_cli("convert --input " + t.model + " --output " + bin).status, 0);
  const std::string other = prepare("b", 20000, 10000);  // another 512-piece tokenizer
  const std::string common = " --batch-size 2 --global-batch 4 --max-steps 1 --no-progress --init-from " + bin;
  auto refused = run_cli("train --data " + other + common);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("stores no tokenizer"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--allow-tokenizer-mismatch"), std::string::npos) << refused.err;
  // The model's own tokenizer given, but the data is from the other one: refused, sha256 named.
  auto wrong = run_cli("train --data " + other + common + " --tokenizer " + scratch() + "/a.model");
  EXPECT_NE(wrong.status, 0);
  EXPECT_NE(wrong.err.find("tokenized with another tokenizer"), std::string::npos) << wrong.err;
  // Even the model's own data needs the tokenizer to be named.
  EXPECT_NE(run_cli("train --data " + t.data + common).status, 0);
  auto right = run_cli("train --data " + t.data + common + " --tokenizer " + scratch() + "/a.model");
  EXPECT_EQ(right.status, 0) << right.err;
  auto allowed = run_cli("train --data " + other + common + " --allow-tokenizer-mismatch");
  EXPECT_EQ(allowed.status, 0) << allowed.err;
  EXPECT_NE(allowed.err.find("warning"), std::string::npos) << allowed.err;
  // The HDF5 model stores its tokenizer: still refused on the other data, as before.
  auto h5 = run_cli("train --data " + other + " --batch-size 2 --global-batch 4 --max-steps 1 --no-progress --init-from " +
                    t.model);
  EXPECT_NE(h5.status, 0);
  EXPECT_NE(h5.err.find("tokenized with another tokenizer"), std::string::npos) << h5.err;
}

TEST(CliModels, ConvertNeverReplacesAForeignConfigJson) {
  const Trained& t = trained();
  const std::string dir = t.dir + "/hf_foreign";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string foreign = R"({"model_type": "llama", "hidden_size": 4096, "note": "someone else's"})";
  write_file_atomic(dir + "/config.json", foreign);
  for (const std::string& out : {dir + "/model.safetensors", dir}) {
    auto r = run_cli("convert --input " + t.model + " --output " + out);
    EXPECT_NE(r.status, 0) << out;
    EXPECT_NE(r.err.find(dir + "/config.json"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--overwrite"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(dir + "/config.json"), foreign);
    EXPECT_FALSE(file_exists(dir + "/model.safetensors"));
  }
  // Our own export of the same model is replaced quietly; of another model (step 1 vs the final
  // one share the shape, so a vocab change is needed: a foreign shape) refused.
  const std::string mine = t.dir + "/hf_mine";
  fs::remove_all(mine);
  ASSERT_EQ(run_cli("convert --input " + t.model + " --output " + mine).status, 0);
  auto again = run_cli("convert --input " + t.ck + " --output " + mine);
  EXPECT_EQ(again.status, 0) << again.err;
  auto j = nlohmann::json::parse(slurp(mine + "/config.json"));
  j["num_hidden_layers"] = 7;
  write_file_atomic(mine + "/config.json", j.dump());
  auto other_shape = run_cli("convert --input " + t.model + " --output " + mine);
  EXPECT_NE(other_shape.status, 0);
  EXPECT_NE(other_shape.err.find("describes another model"), std::string::npos) << other_shape.err;
  // --overwrite replaces it.
  auto forced = run_cli("convert --input " + t.model + " --output " + dir + " --overwrite");
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_NE(slurp(dir + "/config.json"), foreign);
  EXPECT_TRUE(file_exists(dir + "/model.safetensors"));
}

// stderr redirected (a log): plain progress lines; stdout's JSON the same with --no-progress.
TEST(CliModels, EvalShowsProgressOnStderrOnly) {
  const Trained& t = trained();
  auto with = run_cli("eval --model " + t.model + " --data " + t.data + " --split train --json");
  auto without = run_cli("eval --model " + t.model + " --data " + t.data + " --split train --json --no-progress");
  ASSERT_EQ(with.status, 0) << with.err;
  EXPECT_EQ(with.out, without.out);
  EXPECT_TRUE(nlohmann::json::parse(with.out).is_object()) << with.out;
  EXPECT_NE(with.err.find("eval train"), std::string::npos) << with.err;
  EXPECT_NE(with.err.find("sequences"), std::string::npos) << with.err;
  EXPECT_NE(with.err.find("done"), std::string::npos) << with.err;
  EXPECT_EQ(with.err.find('\r'), std::string::npos) << "no carriage returns in a log";
  EXPECT_EQ(without.err.find("eval train"), std::string::npos) << without.err;
}

}  // namespace
}  // namespace lt
