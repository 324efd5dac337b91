#include "llamatrain/model_io.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/llama2c.h"
#include "llamatrain/model.h"

namespace lt {

namespace {

constexpr const char* kModelFormat = "llamatrain-model";
constexpr int64_t kModelFormatVersion = 1;
constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42", versions 1 and 2

void write_config_attrs(h5::File& f, const Llama2Config& c) {
  f.write_attr("/", "dim", int64_t(c.dim));
  f.write_attr("/", "hidden_dim", int64_t(c.hidden_dim));
  f.write_attr("/", "n_layers", int64_t(c.n_layers));
  f.write_attr("/", "n_heads", int64_t(c.n_heads));
  f.write_attr("/", "n_kv_heads", int64_t(c.n_kv_heads));
  f.write_attr("/", "vocab_size", int64_t(c.vocab_size));
  f.write_attr("/", "max_seq_len", int64_t(c.max_seq_len));
  f.write_attr("/", "norm_eps", double(c.norm_eps));
  f.write_attr("/", "rope_theta", double(c.rope_theta));
  f.write_attr("/", "tied_embeddings", int64_t(c.tied_embeddings ? 1 : 0));
}

Llama2Config read_config_attrs(const h5::File& f) {
  if (!f.has_attr("/", "format") || f.read_attr_string("/", "format") != kModelFormat)
    fail(strcat(f.path(), ": HDF5 file is not a llamatrain model (root attribute format != '",
                kModelFormat, "'; a dataset or checkpoint given as a model?)"));
  const int64_t version = f.read_attr_int("/", "format_version");
  if (version != kModelFormatVersion)
    fail(strcat(f.path(), ": model format_version ", version, ", this build reads ", kModelFormatVersion));
  Llama2Config c;
  c.dim = int(f.read_attr_int("/", "dim"));
  c.hidden_dim = int(f.read_attr_int("/", "hidden_dim"));
  c.n_layers = int(f.read_attr_int("/", "n_layers"));
  c.n_heads = int(f.read_attr_int("/", "n_heads"));
  c.n_kv_heads = int(f.read_attr_int("/", "n_kv_heads"));
  c.vocab_size = int(f.read_attr_int("/", "vocab_size"));
  c.max_seq_len = int(f.read_attr_int("/", "max_seq_len"));
  c.norm_eps = float(f.read_attr_double("/", "norm_eps"));
  c.rope_theta = float(f.read_attr_double("/", "rope_theta"));
  c.tied_embeddings = f.read_attr_int("/", "tied_embeddings") != 0;
  try {
    c.validate();
  } catch (const Error& e) {
    fail(strcat(f.path(), ": ", e.what()));
  }
  return c;
}

ModelData load_hdf5(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  ModelData m;
  m.config = read_config_attrs(f);
  const ParameterLayout layout(m.config);
  m.params.assign(layout.total(), 0.f);
  for (const auto& t : layout.tensors()) {
    const std::string obj = "/weights/" + t.name;
    if (!f.exists(obj)) fail(strcat(path, ": missing tensor ", obj));
    const h5::Dims dims = f.shape(obj);
    bool same = dims.size() == t.shape.size();
    for (size_t i = 0; same && i < dims.size(); ++i) same = int64_t(dims[i]) == t.shape[i];
    if (!same) {
      std::string got, want;
      for (auto d : dims) got += (got.empty() ? "" : ",") + std::to_string(d);
      for (auto d : t.shape) want += (want.empty() ? "" : ",") + std::to_string(d);
      fail(strcat(path, ": tensor ", obj, " has shape (", got, "), expected (", want, ")"));
    }
    f.read_into(obj, m.params.data() + t.offset, t.numel);
  }
  if (f.exists("/extras"))
    for (const auto& name : f.list("/extras")) m.extras[name] = f.read<float>("/extras/" + name);
  if (f.exists("/tokenizer/model")) {
    const auto bytes = f.read<uint8_t>("/tokenizer/model");
    m.tokenizer_model.assign(bytes.begin(), bytes.end());
  }
  return m;
}

}  // namespace

const char* model_format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::kHdf5: return "hdf5";
    case ModelFormat::kHf: return "hf";
    default: return "llama2c";
  }
}

ModelFormat detect_model_format(const std::string& path) {
  if (!file_exists(path)) fail(strcat(path, ": model file not found"));
  if (std::filesystem::is_directory(path)) {
    if (is_hf_model(path)) return ModelFormat::kHf;
    fail(strcat(path, ": a directory without ", kHfConfigFile,
                "; a Hugging Face model directory holds config.json and model.safetensors"));
  }
  if (h5::is_hdf5_file(path)) return ModelFormat::kHdf5;
  // A safetensors header length is < 100 MB; a llama2.c v0 file starts with dim and hidden_dim,
  // which as one little-endian u64 is at least 2^32, so the two cannot be confused.
  if (is_hf_model(path)) return ModelFormat::kHf;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(strcat(path, ": cannot open"));
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  if (!in) fail(strcat(path, ": too short to be a model file (", file_size(path), " bytes)"));
  if (magic == kLlama2cMagic) {
    int32_t version = 0;
    in.read(reinterpret_cast<char*>(&version), sizeof version);
    fail(strcat(path, ": llama2.c version ", version,
                " file; only the v0 (legacy) format is supported (export.py --version 0)"));
  }
  return ModelFormat::kLlama2c;
}

Llama2Config read_model_config(const std::string& path) {
  switch (detect_model_format(path)) {
    case ModelFormat::kHdf5: {
      h5::File f = h5::File::open_read(path);
      return read_config_attrs(f);
    }
    case ModelFormat::kHf:
      return read_model_config_hf(path);
    default: {
      std::ifstream in(path, std::ios::binary);
      char header[kLlama2cHeaderBytes];
      in.read(header, sizeof header);
      return llama2c_parse_header(std::string_view(header, size_t(in.gcount())), file_size(path), path);
    }
  }
}

ModelData load_model(const std::string& path) {
  switch (detect_model_format(path)) {
    case ModelFormat::kHdf5: return load_hdf5(path);
    case ModelFormat::kHf: return load_model_hf(path);
    default: return load_llama2c(path);
  }
}

void save_model_hdf5(const std::string& path, const ModelData& m) {
  const ParameterLayout layout(m.config);
  LT_CHECK(m.params.size() == layout.total(), "parameter buffer has ", m.params.size(),
           " floats, layout expects ", layout.total());
  const std::string tmp = temp_path_for(path);
  {
    h5::File f = h5::File::create(tmp);
    f.write_attr("/", "format", std::string(kModelFormat));
    f.write_attr("/", "format_version", kModelFormatVersion);
    f.write_attr("/", "tool_version", std::string(LLAMATRAIN_VERSION));
    write_config_attrs(f, m.config);
    for (const auto& t : layout.tensors()) {
      h5::Dims dims(t.shape.begin(), t.shape.end());
      f.write("/weights/" + t.name, dims, m.params.data() + t.offset);
    }
    for (const auto& [name, v] : m.extras) f.write("/extras/" + name, {v.size()}, v.data());
    if (!m.tokenizer_model.empty())
      f.write("/tokenizer/model", {m.tokenizer_model.size()},
              reinterpret_cast<const uint8_t*>(m.tokenizer_model.data()));
    f.close();
  }
  publish_file(tmp, path);
}

}  // namespace lt
