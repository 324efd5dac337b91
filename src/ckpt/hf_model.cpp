// Hugging Face layout import/export (hf_model.h): safetensors (single or sharded), the q/k RoPE
// permutation, tokenizer.model; config.json is read and written by hf_config.cpp, the tokenizer's
// JSON files by hf_tokenizer.cpp.
#include "llamatrain/hf_model.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/json_read.h"
#include "llamatrain/model.h"
#include "llamatrain/safetensors.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using safetensors::Dtype;

// JSON side files (config.json, the index) are a few KB; a bound keeps a hostile one from
// being read whole into memory.
constexpr uint64_t kMaxJsonFileBytes = 64ull << 20;

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_json_file(const std::string& path) {
  if (!file_exists(path)) fail(strcat(path, ": not found"));
  const uint64_t size = file_size(path);
  if (size > kMaxJsonFileBytes)
    fail(strcat(path, ": ", size, " bytes, larger than any JSON file of a model (limit ", kMaxJsonFileBytes, ")"));
  return read_file_bytes(path);
}

// ---- tensor names ----

struct HfTensor {
  std::string name;        // HF name
  const TensorInfo* info;  // where it lives in the flat buffer
  int permute_heads;       // > 0: rows permuted over this many heads (wq, wk)
};

// Maps the Meta names of ParameterLayout ("layers.3.attention.wq.weight") to HF names, in the
// order transformers' state dict lists them.
std::vector<HfTensor> hf_tensors(const ParameterLayout& layout, const Llama2Config& c) {
  static const std::pair<const char*, const char*> kLayerNames[] = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},     {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},     {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},     {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},     {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  std::vector<HfTensor> out;
  out.push_back({"model.embed_tokens.weight", &layout.find("tok_embeddings.weight"), 0});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string meta = strcat("layers.", l, ".");
    const std::string hf = strcat("model.layers.", l, ".");
    for (const auto& [m, h] : kLayerNames) {
      const int heads = std::strcmp(m, "attention.wq.weight") == 0   ? c.n_heads
                        : std::strcmp(m, "attention.wk.weight") == 0 ? c.n_kv_heads
                                                                     : 0;
      out.push_back({hf + h, &layout.find(meta + m), heads});
    }
  }
  out.push_back({"model.norm.weight", &layout.find("norm.weight"), 0});
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", &layout.find("output.weight"), 0});
  return out;
}

std::string shape_text(const std::vector<uint64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += strcat(i ? ", " : "", s[i]);
  return t + ")";
}

// ---- base64 (RFC 4648), for the extras carried in __metadata__ ----

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out += kBase64[v >> 18 & 63];
    out += kBase64[v >> 12 & 63];
    out += i + 1 < n ? kBase64[v >> 6 & 63] : '=';
    out += i + 2 < n ? kBase64[v & 63] : '=';
  }
  return out;
}

// Decodes into floats; false when the text is not base64 of a whole number of floats.
bool base64_decode_floats(const std::string& s, std::vector<float>& out) {
  if (s.size() % 4 != 0) return false;
  std::string bytes;
  bytes.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char ch = s[i + k];
      const char* pos = ch ? std::strchr(kBase64, ch) : nullptr;
      if (ch == '=' && i + 4 == s.size() && k >= 2) {
        ++pad;
        v <<= 6;
        continue;
      }
      if (!pos || pad) return false;
      v = v << 6 | uint32_t(pos - kBase64);
    }
    bytes += char(v >> 16);
    if (pad < 2) bytes += char(v >> 8 & 255);
    if (pad < 1) bytes += char(v & 255);
  }
  if (bytes.size() % 4 != 0) return false;
  out.resize(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return true;
}

// ---- reading ----

// A checked, opened HF model: config, every safetensors header validated, every expected
// tensor found with the expected shape and a float dtype. Nothing large is allocated yet.
struct HfSource {
  std::string dir;
  Llama2Config config;
  std::vector<safetensors::Reader> files;
  struct Found {
    const safetensors::Reader* file;
    const safetensors::TensorEntry* entry;
  };
  std::map<std::string, Found> tensors;  // HF name -> where
  std::map<std::string, std::vector<float>> extras;
};

// The safetensors files of the model at `path`, in a stable order.
std::vector<std::string> weight_files(const std::string& path, const std::string& dir,
                                      std::map<std::string, std::string>* index_map) {
  // A single .safetensors file named directly (config.json names the whole directory).
  if (!fs::is_directory(path) && fs::path(path).filename() != kHfConfigFile) return {path};
  const std::string index_path = join(dir, kHfIndexFile);
  if (file_exists(index_path)) {
    const nlohmann::json j = parse_json_object_text(read_json_file(index_path), index_path);
    const auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) fail(strcat(index_path, ": no \"weight_map\" object"));
    std::set<std::string> names;
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string()) fail(strcat(index_path, ": weight_map entry '", tensor, "' is not a file name"));
      const std::string f = file.get<std::string>();
      // Untrusted: the index may only name files inside the model directory.
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\\') != std::string::npos)
        fail(strcat(index_path, ": weight_map entry '", tensor, "' names '", f,
                    "', expected a file name inside the model directory"));
      (*index_map)[tensor] = f;
      names.insert(f);
    }
    if (names.empty()) fail(strcat(index_path, ": weight_map is empty"));
    std::vector<std::string> out;
    for (const auto& n : names) {
      const std::string p = join(dir, n);
      if (!file_exists(p)) fail(strcat(index_path, ": names shard ", n, ", which is missing from ", dir));
      out.push_back(p);
    }
    return out;
  }
  const std::string single = join(dir, kHfSingleFile);
  if (file_exists(single)) return {single};
  fail(strcat(dir, ": has config.json but neither ", kHfSingleFile, " nor ", kHfIndexFile,
              " (PyTorch .bin weights are not read; save with safe_serialization=True)"));
}

HfSource open_hf(const std::string& path) {
  HfSource src;
  src.dir = hf_model_dir(path);
  const std::string config_path = join(src.dir, kHfConfigFile);
  if (!file_exists(config_path))
    fail(strcat(path, ": a safetensors file without ", kHfConfigFile,
                " beside it (the Hugging Face layout needs config.json for the model shape)"));
  src.config = hf_config_from_json(read_json_file(config_path), config_path);
  const Llama2Config& c = src.config;

  std::map<std::string, std::string> index_map;
  for (const auto& f : weight_files(path, src.dir, &index_map)) src.files.emplace_back(f);
  for (const auto& r : src.files) {
    for (const auto& t : r.header().tensors) {
      const auto [it, fresh] = src.tensors.insert({t.name, {&r, &t}});
      if (!fresh)
        fail(strcat(src.dir, ": tensor '", t.name, "' is stored twice, in ", it->second.file->path(), " and ",
                    r.path()));
    }
    for (const auto& [key, value] : r.header().metadata) {
      if (key.rfind(kHfExtraMetadataPrefix, 0) != 0) continue;
      std::vector<float> v;
      if (!base64_decode_floats(value, v))
        fail(strcat(r.path(), ": __metadata__ entry '", key, "' is not base64 of float32 values"));
      src.extras[key.substr(std::strlen(kHfExtraMetadataPrefix))] = std::move(v);
    }
  }
  const std::string where = index_map.empty() ? src.files.front().path() : join(src.dir, kHfIndexFile);

  const ParameterLayout layout(c);
  std::set<std::string> expected;
  for (const auto& t : hf_tensors(layout, c)) {
    expected.insert(t.name);
    const auto it = src.tensors.find(t.name);
    if (it == src.tensors.end())
      fail(strcat(where, ": tensor '", t.name, "' is missing (config.json: num_hidden_layers=", c.n_layers,
                  " tie_word_embeddings=", c.tied_embeddings ? "true" : "false", ")"));
    const auto& [file, entry] = it->second;
    const auto im = index_map.find(t.name);
    if (im != index_map.end() && fs::path(file->path()).filename() != im->second)
      fail(strcat(join(src.dir, kHfIndexFile), ": weight_map puts '", t.name, "' in ", im->second, " but it is in ",
                  file->path()));
    const std::vector<uint64_t> want(t.info->shape.begin(), t.info->shape.end());
    if (entry->shape != want)
      fail(strcat(file->path(), ": tensor '", t.name, "' has shape ", shape_text(entry->shape),
                  ", config.json implies ", shape_text(want)));
    if (entry->dtype != Dtype::kF32 && entry->dtype != Dtype::kF16 && entry->dtype != Dtype::kBF16)
      fail(strcat(file->path(), ": tensor '", t.name, "' has dtype ", safetensors::dtype_name(entry->dtype),
                  "; model weights must be F32, F16 or BF16"));
  }
  for (const auto& [name, found] : src.tensors) {
    if (expected.count(name)) continue;
    // Tolerated leftovers: older transformers saved the RoPE inverse frequencies; a tied model
    // may still carry a copy of the embedding as lm_head.
    if (ends_with(name, ".rotary_emb.inv_freq") || (c.tied_embeddings && name == "lm_head.weight")) continue;
    fail(strcat(found.file->path(), ": unexpected tensor '", name, "' (not a plain Llama model, or config.json ",
                "disagrees with the weights: num_hidden_layers=", c.n_layers, ")"));
  }
  return src;
}

// ---- writing ----

// Removes weight files of an earlier export into `dir` that this export did not write, so a
// reader never mixes old shards (or an old index) with the new model.
void remove_stale_weights(const std::string& dir, const std::set<std::string>& written) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // model-00001-of-00002.safetensors: "model-" 5 digits "-of-" 5 digits ".safetensors"
    bool shard = name.size() == 32 && name.rfind("model-", 0) == 0 && name.compare(11, 4, "-of-") == 0 &&
                 ends_with(name, ".safetensors");
    for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19})
      shard = shard && i < name.size() && std::isdigit(uint8_t(name[i]));
    const bool ours = shard || name == kHfSingleFile || name == kHfIndexFile;
    if (ours && !written.count(name)) fs::remove(e.path(), ec);
  }
}

}  // namespace

bool is_hf_model(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return file_exists(join(path, kHfConfigFile));
  if (fs::path(path).filename() == kHfConfigFile) return file_exists(path);
  if (!fs::is_regular_file(path, ec)) return false;  // a FIFO would block the open
  std::ifstream in(path, std::ios::binary);
  char head[9];
  if (!in.read(head, 9)) return false;
  uint64_t n = 0;
  std::memcpy(&n, head, 8);
  return n <= safetensors::kMaxHeaderBytes && n + 8 <= file_size(path) && head[8] == '{';
}

std::string hf_model_dir(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path;
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

void hf_permute_from_meta(float* hf, const float* meta, int n_heads, int head_dim, int row_len) {
  const size_t half = size_t(head_dim) / 2, len = size_t(row_len);
  for (size_t h = 0; h < size_t(n_heads); ++h)
    for (size_t p = 0; p < 2; ++p)
      for (size_t i = 0; i < half; ++i)
        std::memcpy(hf + (h * head_dim + p * half + i) * len, meta + (h * head_dim + 2 * i + p) * len,
                    len * sizeof(float));
}

void hf_permute_to_meta(float* meta, const float* hf, int n_heads, int head_dim, int row_len) {
  const size_t half = size_t(head_dim) / 2, len = size_t(row_len);
  for (size_t h = 0; h < size_t(n_heads); ++h)
    for (size_t p = 0; p < 2; ++p)
      for (size_t i = 0; i < half; ++i)
        std::memcpy(meta + (h * head_dim + 2 * i + p) * len, hf + (h * head_dim + p * half + i) * len,
                    len * sizeof(float));
}

Llama2Config read_model_config_hf(const std::string& path) { return open_hf(path).config; }

ModelData load_model_hf(const std::string& path) {
  const HfSource src = open_hf(path);
  ModelData m;
  m.config = src.config;
  const ParameterLayout layout(m.config);
  m.params.assign(layout.total(), 0.f);
  std::vector<float> tmp;
  for (const auto& t : hf_tensors(layout, m.config)) {
    const auto& [file, entry] = src.tensors.at(t.name);
    float* dst = m.params.data() + t.info->offset;
    if (t.permute_heads == 0) {
      file->read_f32(*entry, dst);
      continue;
    }
    tmp.resize(t.info->numel);
    file->read_f32(*entry, tmp.data());
    hf_permute_to_meta(dst, tmp.data(), t.permute_heads, m.config.head_dim(), m.config.dim);
  }
  m.extras = src.extras;
  const std::string tok = join(src.dir, kHfTokenizerFile);
  if (file_exists(tok)) m.tokenizer_model = read_file_bytes(tok);
  return m;
}

namespace {

// save_model_hf's writing: the shards, the index and config.json; each file's path goes to
// `published` once it is complete.
void write_hf_files(const std::string& dir, const std::string& path, bool one_file,
                    const std::vector<std::vector<const HfTensor*>>& shards, const ModelData& m, const Llama2Config& c,
                    Dtype dtype, const std::map<std::string, std::string>& first_metadata,
                    uint64_t total, const HfExportOptions& opt, std::set<std::string>& written,
                    std::vector<std::string>& published) {
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<float> permuted;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = one_file ? path : join(dir, shards.size() == 1 ? kHfSingleFile : name);
    const std::string file_name = fs::path(file).filename().string();
    // q/k are permuted into one scratch buffer per shard, so the extra memory is bounded by the
    // shard size rather than the model size.
    size_t scratch = 0;
    for (const HfTensor* t : shards[s])
      if (t->permute_heads) scratch += t->info->numel;
    permuted.resize(scratch);
    std::vector<safetensors::TensorToWrite> out;
    size_t used = 0;
    for (const HfTensor* t : shards[s]) {
      const float* data = m.params.data() + t->info->offset;
      if (t->permute_heads) {
        hf_permute_from_meta(permuted.data() + used, data, t->permute_heads, c.head_dim(), c.dim);
        data = permuted.data() + used;
        used += t->info->numel;
      }
      out.push_back({t->name, std::vector<uint64_t>(t->info->shape.begin(), t->info->shape.end()), data});
      weight_map[t->name] = file_name;
    }
    safetensors::write_file(file, out, dtype,
                            s == 0 ? first_metadata : std::map<std::string, std::string>{{"format", "pt"}});
    published.push_back(file);
    written.insert(file_name);
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_file_atomic(join(dir, kHfIndexFile), index.dump(2) + "\n");
    published.push_back(join(dir, kHfIndexFile));
    written.insert(kHfIndexFile);
  }
  write_file_atomic(join(dir, kHfConfigFile), hf_config_to_json(c, opt.bf16));
  published.push_back(join(dir, kHfConfigFile));
}

// tokenizer.model and the JSON files AutoTokenizer reads beside it.
void write_hf_tokenizer(const std::string& dir, const std::string& sp_model, const HfTokenizerFiles& files,
                        std::vector<std::string>& published) {
  for (const auto& [name, bytes] : {std::pair<const char*, const std::string*>{kHfTokenizerFile, &sp_model},
                                    {kHfTokenizerConfigFile, &files.config},
                                    {kHfSpecialTokensFile, &files.special_tokens_map}}) {
    write_file_atomic(join(dir, name), *bytes);
    published.push_back(join(dir, name));
  }
}

}  // namespace

void save_model_hf(const std::string& path, const ModelData& m, const HfExportOptions& opt) {
  const Llama2Config& c = m.config;
  const ParameterLayout layout(c);
  LT_CHECK(m.params.size() == layout.total(), "parameter buffer has ", m.params.size(), " floats, layout expects ",
           layout.total());
  LT_CHECK(opt.max_shard_bytes > 0, "max_shard_bytes must be positive");
  const bool one_file = ends_with(path, ".safetensors");
  const std::string dir = one_file ? hf_model_dir(path) : path;
  const std::string config_path = join(dir, kHfConfigFile);
  if (!opt.overwrite && file_exists(config_path)) {
    std::string why;
    try {
      const std::string text = read_json_file(config_path);
      if (!parse_json_object_text(text, config_path).contains("llamatrain_version"))
        why = "was not written by llamatrain";
      else if (const Llama2Config old = hf_config_from_json(text, config_path); old.to_string() != c.to_string())
        why = strcat("describes another model (", old.to_string(), ")");
    } catch (const Error& e) {
      why = strcat("cannot be read as a model config (", e.what(), ")");
    }
    if (!why.empty())
      fail(strcat(config_path, " exists and ", why, "; exporting to ", path, " would replace it",
                  one_file ? "" : " and the weight files beside it",
                  ". Write to a new folder, or pass --overwrite to replace it"));
  }
  // The tokenizer's files are made first: a tokenizer that does not load stops the export before
  // anything is written.
  HfTokenizerFiles tok_files;
  if (!m.tokenizer_model.empty())
    tok_files = hf_tokenizer_files(m.tokenizer_model, strcat("the tokenizer to export as ", join(dir, kHfTokenizerFile)),
                                   c.max_seq_len);

  make_dirs(dir);
  const Dtype dtype = opt.bf16 ? Dtype::kBF16 : Dtype::kF32;
  const uint64_t esize = safetensors::dtype_size(dtype);

  // Shards as transformers cuts them: tensors in order, a new shard when the next tensor would
  // push the current one past the limit (a tensor larger than the limit gets a shard alone).
  const std::vector<HfTensor> tensors = hf_tensors(layout, c);
  std::vector<std::vector<const HfTensor*>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = uint64_t(t.info->numel) * esize;
    if (!one_file && !shards.back().empty() && in_shard + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes;
    total += bytes;
  }

  std::map<std::string, std::string> first_metadata{{"format", "pt"}};  // transformers requires "pt"
  for (const auto& [name, v] : m.extras)
    first_metadata[kHfExtraMetadataPrefix + name] = base64_encode(v.data(), v.size() * sizeof(float));

  std::set<std::string> written;
  // This export's files, removed again when a later one fails (a full disk at shard 3 of 11 must
  // not leave shards 1 and 2 under their final names, looking like a model).
  std::vector<std::string> published;
  try {
    write_hf_files(dir, path, one_file, shards, m, c, dtype, first_metadata, total, opt, written, published);
    if (!m.tokenizer_model.empty()) write_hf_tokenizer(dir, m.tokenizer_model, tok_files, published);
  } catch (...) {
    for (const std::string& f : published) std::remove(f.c_str());
    throw;
  }
  if (!one_file) remove_stale_weights(dir, written);
}


}  // namespace lt
