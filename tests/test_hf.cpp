// Hugging Face layout import/export and the safetensors reader: the q/k RoPE permutation,
// round trips (llama2.c -> HF -> HDF5 -> llama2.c byte-identical on stories260K, with the same
// greedy text at every stage), fixtures written by the official `safetensors` package
// (tests/fixtures/make_hf_fixtures.py), bf16 rounding, sharding, `convert`'s format choice, and
// one test per kind of damaged or inconsistent input, each checking its message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "llamatrain/fsutil.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/safetensors.h"
#include "test_util.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using testing::error_of;
using testing::run_cli;

const std::string kShared = testing::kSharedData;
const std::string kFixtures = std::string(LLAMATRAIN_SOURCE_DIR) + "/tests/fixtures/hf_tiny";

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Expects the message of f's exception to contain every needle.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  const std::string e = error_of(f);
  for (const auto& n : needles) EXPECT_NE(e.find(n), std::string::npos) << "missing '" << n << "' in: " << e;
}

ModelData random_model(bool tied, int n_layers = 2) {
  Llama2Config c;
  c.dim = 16;
  c.hidden_dim = 40;
  c.n_layers = n_layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 37;
  c.max_seq_len = 12;
  c.tied_embeddings = tied;
  Llama2Model m(c);
  m.init_random(tied ? 3 : 4);
  ModelData d;
  d.config = c;
  d.params = m.params();
  return d;
}

// ---- the q/k permutation ----

TEST(Hf, PermutationMatchesTheDefinitionOnASmallExample) {
  // Two heads of head_dim 4, rows of length 2 (row r holds {10r, 10r+1}). Within each head HF
  // stores Meta's even rows first, then its odd rows: HF = Meta rows 0 2 1 3 | 4 6 5 7.
  std::vector<float> meta(16), hf(16), back(16);
  for (int r = 0; r < 8; ++r) meta[2 * r] = 10.f * r, meta[2 * r + 1] = 10.f * r + 1;
  hf_permute_from_meta(hf.data(), meta.data(), 2, 4, 2);
  const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(hf[2 * r], 10.f * order[r]) << "HF row " << r;
    EXPECT_EQ(hf[2 * r + 1], 10.f * order[r] + 1) << "HF row " << r;
  }
  hf_permute_to_meta(back.data(), hf.data(), 2, 4, 2);
  EXPECT_EQ(back, meta);
}

TEST(Hf, MetaToHfToMetaIsIdentity) {
  // The permutation pair on random data for several head layouts...
  for (const auto& [heads, hd, len] :
       std::vector<std::tuple<int, int, int>>{{1, 2, 3}, {4, 8, 5}, {3, 16, 1}, {8, 128, 2}}) {
    std::vector<float> meta(size_t(heads) * hd * len), hf(meta.size()), back(meta.size());
    for (size_t i = 0; i < meta.size(); ++i) meta[i] = std::sin(float(i) * 0.37f);
    hf_permute_from_meta(hf.data(), meta.data(), heads, hd, len);
    // With head_dim 2 there is one even and one odd row per head: the permutation is the identity.
    if (hd == 2)
      EXPECT_EQ(hf, meta);
    else
      EXPECT_NE(hf, meta) << heads << "x" << hd;
    hf_permute_to_meta(back.data(), hf.data(), heads, hd, len);
    EXPECT_EQ(back, meta) << heads << "x" << hd;
  }
  // ...and whole models through files, tied and untied, with GQA (4 heads, 2 KV heads).
  const std::string base = testing::scratch_dir().string();
  for (bool tied : {true, false}) {
    const ModelData m = random_model(tied);
    const std::string dir = base + (tied ? "/tied" : "/untied");
    save_model_hf(dir, m);
    EXPECT_TRUE(file_exists(dir + "/config.json"));
    EXPECT_TRUE(file_exists(dir + "/model.safetensors"));
    EXPECT_EQ(detect_model_format(dir), ModelFormat::kHf);
    const ModelData b = load_model(dir);
    EXPECT_EQ(b.config.to_string(), m.config.to_string());
    EXPECT_EQ(b.params, m.params) << "tied=" << tied;
    // wq in the file is the permuted Meta wq; wv is stored as is.
    const st::Reader r(dir + "/model.safetensors");
    const ParameterLayout layout(m.config);
    const TensorInfo& wq = layout.find("layers.1.attention.wq.weight");
    std::vector<float> q(wq.numel), expect(wq.numel);
    r.read_f32(*r.header().find("model.layers.1.self_attn.q_proj.weight"), q.data());
    hf_permute_from_meta(expect.data(), m.params.data() + wq.offset, 4, 4, 16);
    EXPECT_EQ(q, expect);
    EXPECT_EQ(r.header().find("lm_head.weight") == nullptr, tied);
  }
}

// ---- stories260K through every format ----

TEST(Hf, Stories260kLlama2cToHfToHdf5ToLlama2cIsByteIdenticalWithTheSameGreedyText) {
  const std::string bin = kShared + "/stories260K.bin", tok = kShared + "/tok512.model";
  if (!file_exists(bin)) GTEST_SKIP() << bin << " absent (../shared/data not present)";
  const std::string dir = testing::scratch_dir().string();
  const std::string hf = dir + "/hf", h5 = dir + "/s.h5", back = dir + "/back.bin";
  for (const std::string& args :
       {"convert --input " + bin + " --output " + hf + " --tokenizer " + tok,
        "convert --input " + hf + " --output " + h5, "convert --input " + h5 + " --output " + back}) {
    const auto r = run_cli(args);
    ASSERT_EQ(r.status, 0) << args << "\n" << r.err;
  }
  EXPECT_TRUE(file_exists(hf + "/model.safetensors"));
  EXPECT_TRUE(file_exists(hf + "/tokenizer.model"));
  EXPECT_EQ(read_file_bytes(hf + "/tokenizer.model"), read_file_bytes(tok));
  EXPECT_EQ(file_size(back), 1056540u);
  EXPECT_EQ(sha256_file(back), sha256_file(bin));

  const std::string gen = " --tokenizer " + tok + " --prompt 'Once upon a time' --max-new-tokens 40 --temperature 0";
  const auto reference = run_cli("generate --model " + bin + gen);
  ASSERT_EQ(reference.status, 0) << reference.err;
  ASSERT_EQ(reference.out.rfind("Once upon a time", 0), 0u) << reference.out;
  EXPECT_GT(reference.out.size(), 80u) << reference.out;
  for (const std::string& model : {hf, hf + "/model.safetensors", h5, back}) {
    const auto g = run_cli("generate --model " + model + gen);
    ASSERT_EQ(g.status, 0) << model << "\n" << g.err;
    EXPECT_EQ(g.out, reference.out) << model;
  }
  // The HF directory carries tokenizer.model, so --tokenizer is optional there.
  const auto own =
      run_cli("generate --model " + hf + " --prompt 'Once upon a time' --max-new-tokens 40 --temperature 0");
  ASSERT_EQ(own.status, 0) << own.err;
  EXPECT_EQ(own.out, reference.out);
}

// The export carries the tokenizer as transformers' AutoTokenizer reads it: tokenizer.model, and
// tokenizer_config.json and special_tokens_map.json with tok512.model's own special pieces, BOS
// added and EOS not, and the model's max_seq_len (stories260K: 512); from --tokenizer or from the
// model file that carries one. Without either, one note on stderr and none of the three files.
// (tests/hf/test_hf_tokenizer.py loads such exports with transformers itself.)
TEST(Hf, ExportCarriesTheTokenizerFilesAutoTokenizerReads) {
  const std::string bin = kShared + "/stories260K.bin", tok = kShared + "/tok512.model";
  if (!file_exists(bin)) GTEST_SKIP() << bin << " absent (../shared/data not present)";
  const std::string dir = testing::scratch_dir().string();
  const std::string given = dir + "/given", carried = dir + "/carried", none = dir + "/none", h5 = dir + "/s.h5";
  for (const std::string& args : {"convert --input " + bin + " --tokenizer " + tok + " --output " + given,
                                  "convert --input " + bin + " --tokenizer " + tok + " --output " + h5,
                                  "convert --input " + h5 + " --output " + carried}) {
    const auto r = run_cli(args);
    ASSERT_EQ(r.status, 0) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("carries no tokenizer"), std::string::npos) << r.err;
  }
  for (const std::string& hf : {given, carried}) {
    EXPECT_EQ(read_file_bytes(hf + "/tokenizer.model"), read_file_bytes(tok)) << hf;
    const auto config = nlohmann::json::parse(read_file_bytes(hf + "/tokenizer_config.json"));
    EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer") << hf;
    EXPECT_EQ(config["add_bos_token"], true);
    EXPECT_EQ(config["add_eos_token"], false);
    EXPECT_EQ(config["bos_token"], "<s>");
    EXPECT_EQ(config["eos_token"], "</s>");
    EXPECT_EQ(config["unk_token"], "<unk>");
    EXPECT_TRUE(config["pad_token"].is_null()) << "tok512.model defines no pad piece";
    EXPECT_EQ(config["model_max_length"], 512);
    EXPECT_EQ(config["legacy"], false);
    EXPECT_EQ(config["clean_up_tokenization_spaces"], false);
    const auto special = nlohmann::json::parse(read_file_bytes(hf + "/special_tokens_map.json"));
    EXPECT_EQ(special, nlohmann::json({{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}})) << hf;
  }
  const auto r = run_cli("convert --input " + bin + " --output " + none);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("convert: note: " + bin + " carries no tokenizer and no --tokenizer was given"),
            std::string::npos) << r.err;
  const size_t at = r.err.find("carries no tokenizer");
  EXPECT_EQ(r.err.find("carries no tokenizer", at + 1), std::string::npos) << "said once: " << r.err;
  EXPECT_TRUE(file_exists(none + "/model.safetensors"));
  for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
    EXPECT_FALSE(file_exists(none + "/" + f)) << f;
}

// ---- fixtures written by the official safetensors package ----

// The fixture value formula of make_hf_fixtures.py, in the HF layout.
float fixture_value(const std::string& name, uint64_t i) {
  int sum = 0;
  for (unsigned char ch : name) sum += ch;
  return float(int64_t((7 * i + 13 * uint64_t(sum % 97)) % 61) - 30) / 64.f;
}

// Checks every element of a loaded fixture model against the formula, mapping names and
// undoing the q/k permutation by its definition (written out here, independently of hf_model).
void expect_fixture_values(const ModelData& m) {
  const Llama2Config& c = m.config;
  const ParameterLayout layout(c);
  const int hd = c.head_dim();
  auto check = [&](const std::string& meta, const std::string& hf, int permute_heads) {
    const TensorInfo& t = layout.find(meta);
    const size_t cols = t.shape.size() == 2 ? size_t(t.shape[1]) : 1, rows = t.numel / cols;
    for (size_t r = 0; r < rows; ++r) {
      size_t hf_row = r;
      if (permute_heads) {  // Meta row h*hd + 2i + p is HF row h*hd + p*hd/2 + i
        const size_t h = r / hd, i = (r % hd) / 2, p = r % 2;
        hf_row = h * hd + p * (hd / 2) + i;
      }
      for (size_t k = 0; k < cols; ++k)
        ASSERT_EQ(m.params[t.offset + r * cols + k], fixture_value(hf, hf_row * cols + k)) << meta << " row " << r;
    }
  };
  check("tok_embeddings.weight", "model.embed_tokens.weight", 0);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string M = "layers." + std::to_string(l) + ".", H = "model.layers." + std::to_string(l) + ".";
    check(M + "attention.wq.weight", H + "self_attn.q_proj.weight", c.n_heads);
    check(M + "attention.wk.weight", H + "self_attn.k_proj.weight", c.n_kv_heads);
    check(M + "attention.wv.weight", H + "self_attn.v_proj.weight", 0);
    check(M + "attention.wo.weight", H + "self_attn.o_proj.weight", 0);
    check(M + "feed_forward.w1.weight", H + "mlp.gate_proj.weight", 0);
    check(M + "feed_forward.w2.weight", H + "mlp.down_proj.weight", 0);
    check(M + "feed_forward.w3.weight", H + "mlp.up_proj.weight", 0);
    check(M + "attention_norm.weight", H + "input_layernorm.weight", 0);
    check(M + "ffn_norm.weight", H + "post_attention_layernorm.weight", 0);
  }
  check("norm.weight", "model.norm.weight", 0);
  if (!c.tied_embeddings) check("output.weight", "lm_head.weight", 0);
}

void expect_tiny_config(const Llama2Config& c, bool tied) {
  EXPECT_EQ(c.dim, 8);
  EXPECT_EQ(c.hidden_dim, 16);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.vocab_size, 16);
  EXPECT_EQ(c.max_seq_len, 16);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 10000.f);
  EXPECT_EQ(c.tied_embeddings, tied);
}

TEST(Hf, ReadsF16ModelWrittenBySafetensors) {
  const std::string dir = kFixtures + "/f16";
  EXPECT_EQ(detect_model_format(dir), ModelFormat::kHf);
  expect_tiny_config(read_model_config(dir), false);
  const ModelData m = load_model(dir);
  expect_tiny_config(m.config, false);
  expect_fixture_values(m);
  EXPECT_TRUE(m.tokenizer_model.empty());
  // The single file named directly, and config.json named directly, give the same model.
  EXPECT_EQ(load_model(dir + "/model.safetensors").params, m.params);
  EXPECT_EQ(load_model(dir + "/config.json").params, m.params);
}

TEST(Hf, ReadsBf16TiedModelAndToleratesRotaryInvFreq) {
  const ModelData m = load_model(kFixtures + "/bf16_tied");
  expect_tiny_config(m.config, true);
  expect_fixture_values(m);
}

TEST(Hf, ReadsShardedModelThroughItsIndex) {
  const std::string dir = kFixtures + "/sharded";
  const ModelData m = load_model(dir);
  expect_tiny_config(m.config, false);
  expect_fixture_values(m);  // shard 1 is F32, shard 2 BF16
  // One shard alone is not a model.
  expect_error([&] { load_model(dir + "/model-00002-of-00002.safetensors"); },
               {"model-00002-of-00002.safetensors", "tensor 'model.embed_tokens.weight' is missing"});
}

TEST(Safetensors, F16ConversionMatchesNumpyIncludingSpecials) {
  const st::Reader r(kFixtures + "/f16_values.safetensors");
  const st::TensorEntry* half = r.header().find("half");
  const st::TensorEntry* expected = r.header().find("expected");
  ASSERT_TRUE(half && expected);
  EXPECT_EQ(half->dtype, st::Dtype::kF16);
  std::vector<float> got(half->numel()), want(expected->numel());
  r.read_f32(*half, got.data());
  r.read_f32(*expected, want.data());
  ASSERT_EQ(got.size(), 14u);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(got[i])) << i;
    else
      EXPECT_EQ(bits(got[i]), bits(want[i])) << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(Safetensors, Bf16RoundingMatchesMlDtypesRoundToNearestEven) {
  const st::Reader r(kFixtures + "/bf16_rounding.safetensors");
  const st::TensorEntry* in = r.header().find("input");
  const st::TensorEntry* rounded = r.header().find("rounded");
  ASSERT_TRUE(in && rounded);
  EXPECT_EQ(rounded->dtype, st::Dtype::kBF16);
  std::vector<float> x(in->numel()), y(rounded->numel());
  r.read_f32(*in, x.data());
  r.read_f32(*rounded, y.data());
  ASSERT_EQ(x.size(), 15u);
  for (size_t i = 0; i < x.size(); ++i) {
    const float ours = st::bf16_to_f32(st::f32_to_bf16(x[i]));
    if (std::isnan(y[i]))
      EXPECT_TRUE(std::isnan(ours)) << i;
    else
      EXPECT_EQ(bits(ours), bits(y[i])) << i << ": " << x[i] << " -> " << ours << ", ml_dtypes " << y[i];
  }
  // The two ties spelled out: 1 + 2^-8 rounds down to 1 (even), 1 + 3 * 2^-8 up to 1 + 2^-6.
  EXPECT_EQ(st::f32_to_bf16(1.f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(st::f32_to_bf16(1.f + 3 * 0x1p-8f), 0x3f82);
}

// ---- writing: bf16, shards, file layout ----

TEST(Hf, Bf16ExportStoresRoundedValues) {
  const ModelData m = random_model(false);
  const std::string dir = testing::scratch_dir().string();
  HfExportOptions opt;
  opt.bf16 = true;
  save_model_hf(dir, m, opt);
  const auto config = nlohmann::json::parse(read_file_bytes(dir + "/config.json"));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const st::Reader r(dir + "/model.safetensors");
  for (const auto& t : r.header().tensors) EXPECT_EQ(t.dtype, st::Dtype::kBF16) << t.name;
  const ModelData b = load_model(dir);
  ASSERT_EQ(b.params.size(), m.params.size());
  size_t changed = 0;
  for (size_t i = 0; i < m.params.size(); ++i) {
    ASSERT_EQ(b.params[i], st::bf16_to_f32(st::f32_to_bf16(m.params[i]))) << i;
    ASSERT_LE(std::fabs(b.params[i] - m.params[i]), std::fabs(m.params[i]) * 0x1p-8f) << i;
    changed += b.params[i] != m.params[i];
  }
  EXPECT_GT(changed, m.params.size() / 2) << "random fp32 values should mostly need rounding";
}

TEST(Hf, ShardsAboveTheThresholdWithAnIndexAndRemovesThemWhenRewrittenWhole) {
  const ModelData m = random_model(false, 3);
  const std::string dir = testing::scratch_dir().string();
  HfExportOptions opt;
  opt.max_shard_bytes = 8000;  // the model holds ~31 KB of fp32 tensors
  save_model_hf(dir, m, opt);
  EXPECT_FALSE(file_exists(dir + "/model.safetensors"));
  const auto index = nlohmann::json::parse(read_file_bytes(dir + "/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  ASSERT_GE(files.size(), 4u);
  const std::string last = *files.rbegin();
  EXPECT_EQ(last,
            "model-0000" + std::to_string(files.size()) + "-of-0000" + std::to_string(files.size()) + ".safetensors");
  uint64_t total = 0;
  size_t tensors = 0;
  for (const auto& f : files) {
    const st::Reader r(dir + "/" + f);
    uint64_t bytes = 0;
    for (const auto& t : r.header().tensors) {
      EXPECT_EQ(index["weight_map"][t.name], f) << t.name;
      bytes += t.bytes();
      ++tensors;
    }
    // A shard exceeds the limit only when it holds one tensor larger than the limit.
    EXPECT_TRUE(bytes <= opt.max_shard_bytes || r.header().tensors.size() == 1) << f << ": " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(tensors, index["weight_map"].size());
  EXPECT_EQ(tensors, ParameterLayout(m.config).tensors().size());
  EXPECT_EQ(load_model(dir).params, m.params);

  // Rewritten as one file: the old shards and index go, so no reader can mix them in.
  save_model_hf(dir, m);
  EXPECT_TRUE(file_exists(dir + "/model.safetensors"));
  EXPECT_FALSE(file_exists(dir + "/model.safetensors.index.json"));
  for (const auto& f : files) EXPECT_FALSE(file_exists(dir + "/" + f)) << f;
  EXPECT_EQ(load_model(dir).params, m.params);
}

TEST(Hf, WrittenFilesFollowTheReferenceLayout) {
  ModelData m = random_model(true);
  const std::string dir = testing::scratch_dir().string();
  // A tokenizer that does not load stops the export before any file is written.
  m.tokenizer_model = "not really a tokenizer";
  expect_error([&] { save_model_hf(dir, m); }, {dir + "/tokenizer.model", "not a SentencePiece model"});
  EXPECT_FALSE(file_exists(dir + "/config.json"));
  m.tokenizer_model.clear();
  save_model_hf(dir, m);
  EXPECT_FALSE(file_exists(dir + "/tokenizer.model"));
  const std::string bytes = read_file_bytes(dir + "/model.safetensors");
  const st::Header h = st::parse(bytes, "model.safetensors");
  EXPECT_EQ(h.data_start % 8, 0u) << "header padded to 8 bytes, as the reference writer does";
  EXPECT_EQ(h.metadata.at("format"), "pt") << "transformers refuses files without format=pt";
  uint64_t next = 0;  // contiguous, no holes, covering the data section
  for (const auto& t : h.tensors) {
    EXPECT_EQ(t.begin, next) << t.name;
    next = t.end;
  }
  EXPECT_EQ(next, h.data_size);
  EXPECT_EQ(h.tensors.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(h.tensors.back().name, "model.norm.weight");
  const auto config = nlohmann::json::parse(read_file_bytes(dir + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["rms_norm_eps"].get<double>(), 1e-5) << "shortest decimal of the float, not 9.99999974e-06";
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["num_key_value_heads"], 2);
}

// ---- convert: formats from paths and content ----

TEST(Convert, OutputFormatFollowsThePathAndInputFormatTheContent) {
  const std::string dir = testing::scratch_dir().string();
  const std::string src = kFixtures + "/f16";
  auto ok = [&](const std::string& args) {
    const auto r = run_cli("convert " + args);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    return r;
  };
  ok("--input " + src + " --output " + dir + "/slash/");
  EXPECT_TRUE(file_exists(dir + "/slash/model.safetensors"));
  ok("--input " + src + " --output " + dir + "/noext");
  EXPECT_TRUE(file_exists(dir + "/noext/config.json"));
  fs::create_directories(dir + "/existing.dir");
  ok("--input " + src + " --output " + dir + "/existing.dir");
  EXPECT_TRUE(file_exists(dir + "/existing.dir/model.safetensors"));
  fs::create_directories(dir + "/one");
  ok("--input " + src + " --output " + dir + "/one/w.safetensors --dtype bf16");
  EXPECT_TRUE(file_exists(dir + "/one/w.safetensors"));
  EXPECT_TRUE(file_exists(dir + "/one/config.json"));
  ok("--input " + dir + "/one/w.safetensors --output " + dir + "/m.bin");
  EXPECT_EQ(detect_model_format(dir + "/m.bin"), ModelFormat::kLlama2c);
  ok("--input " + dir + "/m.bin --output " + dir + "/m.h5");
  EXPECT_EQ(detect_model_format(dir + "/m.h5"), ModelFormat::kHdf5);
  ok("--input " + dir + "/m.h5 --output " + dir + "/forced.bin --to hf");
  EXPECT_TRUE(file_exists(dir + "/forced.bin/model.safetensors"));
  // Every stage holds the fixture's values (bf16 is exact for them).
  expect_fixture_values(load_model(dir + "/forced.bin"));

  // Recognised by content: a renamed safetensors file with config.json beside it.
  fs::copy_file(dir + "/one/w.safetensors", dir + "/one/weights.dat");
  EXPECT_EQ(detect_model_format(dir + "/one/weights.dat"), ModelFormat::kHf);
  ok("--input " + dir + "/one/weights.dat --output " + dir + "/again.h5");

  auto bad = [&](const std::string& args, const std::vector<std::string>& needles) {
    const auto r = run_cli("convert " + args);
    EXPECT_NE(r.status, 0) << args;
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
  };
  bad("--input " + src + " --output " + dir + "/x.xyz", {"x.xyz", "--to hdf5|hf|llama2c"});
  bad("--input " + src + " --output " + dir + "/x.bin --dtype bf16", {"--dtype bf16", "HF output only"});
  EXPECT_FALSE(file_exists(dir + "/x.bin"));
  bad("--input " + dir + " --output " + dir + "/y.h5", {dir, "without config.json"});
}

// ---- damaged and inconsistent input ----

// A safetensors file from a header text and a data section.
std::string st_bytes(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

TEST(Safetensors, DamagedHeadersAreRefusedWithTheFileAndTheTensorNamed) {
  const std::string f = "bad.safetensors";
  auto parse = [&](const std::string& bytes) { return [bytes, &f] { st::parse(bytes, f); }; };
  const std::string good_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(st::parse(st_bytes(good_header, std::string(8, '\0')), f).tensors.size(), 1u);

  expect_error(parse("abc"), {f, "too short for a safetensors file", "3 bytes"});
  expect_error(parse(st_bytes(good_header, std::string(4, '\0'))),  // truncated data
               {f, "'a'", "data_offsets [0, 8] reach past the data section (4 bytes; truncated file?)"});
  std::string beyond = st_bytes(good_header, std::string(8, '\0'));
  const uint64_t big = 1000;
  std::memcpy(beyond.data(), &big, 8);
  expect_error(parse(beyond), {f, "header length 1000 reaches past the end of the file"});
  const uint64_t huge = 1ull << 40;
  std::memcpy(beyond.data(), &huge, 8);
  expect_error(parse(beyond), {f, "header length 1099511627776 exceeds the 100000000-byte limit"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", std::string(8, '\0'))),
               {f, "'a'", "reach past the data section"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              std::string(8, '\0'))),
               {f, "'a' [0, 8) and 'b' [4, 8) overlap"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               {f, "'a'", "unknown dtype 'F7'"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               {f, "'a'", "shape (2, 3) of F16 needs 12 bytes but data_offsets [0, 8] hold 8"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                              std::string(8, '\0'))),
               {f, "'a'", "overflows 64 bits"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               {f, "'a'", "shape entry -2 is not a non-negative integer"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'))),
               {f, "'a'", "end before they begin"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'))),
               {f, "'a'", "data_offsets"});
  expect_error(parse(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", std::string(8, '\0'))),
               {f, "not valid JSON"});
  expect_error(parse(st_bytes(R"([1])", "")), {f, "does not start with '{'"});
  expect_error(parse(st_bytes(R"({"a":[[[[[[[[[[[[1]]]]]]]]]]]]})", "")), {f, "nests deeper than"});
  expect_error(parse(st_bytes(R"({"__metadata__":{"k":1}})", "")), {f, "__metadata__ entry 'k' is not a string"});
}

// Writes a copy of the f16 fixture model into directory `dir`, with `edit` applied to its tensor
// list (our writer, fp32) and `config_edit` to its config.json.
std::string edited_model(
    const std::string& dir,
    const std::function<void(std::vector<st::TensorToWrite>&, std::vector<std::vector<float>>&)>& edit,
    const std::function<void(nlohmann::json&)>& config_edit = nullptr) {
  make_dirs(dir);
  const st::Reader r(kFixtures + "/f16/model.safetensors");
  std::vector<std::vector<float>> data;
  std::vector<st::TensorToWrite> tensors;
  data.reserve(r.header().tensors.size() + 4);
  for (const auto& t : r.header().tensors) {
    data.emplace_back(t.numel());
    r.read_f32(t, data.back().data());
    tensors.push_back({t.name, t.shape, data.back().data()});
  }
  edit(tensors, data);
  st::write_file(dir + "/model.safetensors", tensors, st::Dtype::kF32, {{"format", "pt"}});
  auto config = nlohmann::json::parse(read_file_bytes(kFixtures + "/f16/config.json"));
  if (config_edit) config_edit(config);
  write_file_atomic(dir + "/config.json", config.dump());
  return dir;
}

TEST(Hf, InconsistentModelsAreRefusedWithTheFileAndTheTensorNamed) {
  const std::string base = testing::scratch_dir().string();
  const auto none = [](auto&, auto&) {};
  EXPECT_NO_THROW(load_model(edited_model(base + "/fine", none)));

  const std::string missing = edited_model(base + "/missing", [](auto& t, auto&) {
    t.erase(
        std::remove_if(t.begin(), t.end(), [](const auto& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; }),
        t.end());
  });
  expect_error([&] { load_model(missing); }, {missing, "tensor 'model.layers.1.mlp.up_proj.weight' is missing"});

  const std::string shape = edited_model(base + "/shape", [](auto& t, auto&) {
    for (auto& x : t)
      if (x.name == "model.layers.0.self_attn.k_proj.weight") x.shape = {8, 4};
  });
  expect_error([&] { load_model(shape); },
               {shape + "/model.safetensors",
                "'model.layers.0.self_attn.k_proj.weight' has shape (8, 4), config.json implies (4, 8)"});

  const std::string extra = edited_model(base + "/extra", [](auto& t, auto& d) {
    d.emplace_back(8, 0.f);
    t.push_back({"model.layers.0.self_attn.q_proj.bias", {8}, d.back().data()});
  });
  expect_error([&] { load_model(extra); }, {extra, "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"});

  const std::string fewer_layers = edited_model(base + "/layers", none, [](auto& c) { c["num_hidden_layers"] = 1; });
  expect_error([&] { load_model(fewer_layers); }, {"unexpected tensor 'model.layers.1.", "num_hidden_layers=1"});

  // An integer tensor where a weight belongs: our writer stores floats only, so the header of
  // a written file is patched.
  const std::string ints = edited_model(base + "/ints", none);
  {
    std::string bytes = read_file_bytes(ints + "/model.safetensors");
    const std::string from = R"("model.norm.weight":{"dtype":"F32")", to = R"("model.norm.weight":{"dtype":"I32")";
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), to);
    write_file_atomic(ints + "/model.safetensors", bytes);
  }
  expect_error([&] { load_model(ints); }, {ints + "/model.safetensors", "'model.norm.weight' has dtype I32"});

  const auto config_error = [&](const char* name, const std::function<void(nlohmann::json&)>& edit,
                                const std::vector<std::string>& needles) {
    const std::string dir = edited_model(base + "/" + name, none, edit);
    std::vector<std::string> all = needles;
    all.push_back(dir + "/config.json");
    expect_error([&] { load_model(dir); }, all);
  };
  config_error("no_hidden", [](auto& c) { c.erase("hidden_size"); }, {"missing field \"hidden_size\""});
  config_error("mistral", [](auto& c) { c["model_type"] = "mistral"; }, {"\"model_type\" = \"mistral\""});
  config_error("scaling",
               [](auto& c) {
                 c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
               },
               {"rope_scaling", "not supported"});
  config_error("float_dim", [](auto& c) { c["hidden_size"] = 8.5; }, {"\"hidden_size\" = 8.5, expected an integer"});
  config_error("huge", [](auto& c) { c["vocab_size"] = 1ull << 40; },
               {"\"vocab_size\" = 1099511627776", "[1, 16777216]"});
  config_error("heads", [](auto& c) { c["num_attention_heads"] = 3; }, {"dim = 8 is not a multiple of n_heads = 3"});
  config_error("eps", [](auto& c) { c["rms_norm_eps"] = 1e300; }, {"\"rms_norm_eps\"", "positive float"});

  // The layout around the files.
  const std::string lone = base + "/lone";
  make_dirs(lone);
  fs::copy_file(kFixtures + "/f16/model.safetensors", lone + "/m.safetensors");
  expect_error([&] { load_model(lone + "/m.safetensors"); },
               {lone + "/m.safetensors", "without config.json beside it"});
  expect_error([&] { load_model(lone); }, {lone, "a directory without config.json"});
  fs::copy_file(kFixtures + "/f16/config.json", lone + "/config.json");
  expect_error([&] { load_model(lone); }, {lone, "neither model.safetensors nor model.safetensors.index.json"});

  const std::string sharded = base + "/sharded";
  fs::copy(kFixtures + "/sharded", sharded);
  auto index = nlohmann::json::parse(read_file_bytes(sharded + "/model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  write_file_atomic(sharded + "/model.safetensors.index.json", index.dump());
  expect_error([&] { load_model(sharded); },
               {"model.safetensors.index.json", "'model.norm.weight'", "names '../model-00002"});
  index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";
  write_file_atomic(sharded + "/model.safetensors.index.json", index.dump());
  expect_error([&] { load_model(sharded); },
               {"model.safetensors.index.json", "model-00003-of-00002.safetensors, which is missing"});
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_file_atomic(sharded + "/model.safetensors.index.json", index.dump());
  expect_error([&] { load_model(sharded); },
               {"weight_map puts 'model.norm.weight' in model-00001-of-00002.safetensors but it is in"});

  // A tensor stored in two shards.
  fs::copy_file(sharded + "/model-00002-of-00002.safetensors", sharded + "/copy.safetensors");
  index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors";
  index["weight_map"]["extra"] = "copy.safetensors";
  write_file_atomic(sharded + "/model.safetensors.index.json", index.dump());
  expect_error([&] { load_model(sharded); }, {"is stored twice", "copy.safetensors"});
}

TEST(Convert, Llama2cOutputWarnsWhenNormEpsOrRopeThetaCannotBeRecorded) {
  const std::string base = testing::scratch_dir().string();
  const auto none = [](auto&, auto&) {};
  const std::string llama = edited_model(base + "/eps5", none);
  const std::string other = edited_model(base + "/eps6", none, [](auto& c) { c["rms_norm_eps"] = 1e-6; });
  const auto quiet = run_cli("convert --input " + llama + " --output " + llama + "/m.bin");
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("warning"), std::string::npos) << quiet.err;
  const auto warned = run_cli("convert --input " + other + " --output " + other + "/m.bin");
  ASSERT_EQ(warned.status, 0) << warned.err;
  EXPECT_NE(warned.err.find("warning: llama2.c v0 cannot record norm_eps=1e-06"), std::string::npos) << warned.err;
  // The HF and HDF5 formats keep it.
  ASSERT_EQ(run_cli("convert --input " + other + " --output " + other + "/m.h5").status, 0);
  EXPECT_EQ(read_model_config(other + "/m.h5").norm_eps, 1e-6f);
}

TEST(Hf, TruncatedWeightFileIsRefusedBeforeReading) {
  const std::string dir = (testing::scratch_dir() / "t").string();
  fs::copy(kFixtures + "/f16", dir);
  const std::string bytes = read_file_bytes(dir + "/model.safetensors");
  write_file_atomic(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  expect_error([&] { read_model_config(dir); },
               {dir + "/model.safetensors", "reach past the data section", "truncated"});
  const auto r = run_cli("generate --model " + dir + " --prompt hi");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lt
