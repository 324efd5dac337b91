#include "llamatrain/model_io.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/model.h"

namespace lt {

namespace {

constexpr const char* kModelFormat = "llamatrain-model";
constexpr int64_t kModelFormatVersion = 1;
constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42", versions 1 and 2
constexpr size_t kLlama2cHeaderBytes = 7 * sizeof(int32_t);

struct Llama2cHeader {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

// Parses and checks a llama2.c v0 header against the file size; returns the config.
Llama2Config llama2c_config(const std::string& path, const Llama2cHeader& h, uint64_t size) {
  auto bad = [&](const std::string& what) {
    fail(strcat(path, ": not a valid llama2.c v0 model: ", what));
  };
  if (h.dim <= 0 || h.hidden_dim <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 ||
      h.seq_len <= 0 || h.vocab_size == 0)
    bad(strcat("header fields dim=", h.dim, " hidden_dim=", h.hidden_dim, " n_layers=", h.n_layers,
               " n_heads=", h.n_heads, " n_kv_heads=", h.n_kv_heads, " vocab_size=", h.vocab_size,
               " seq_len=", h.seq_len, " must be positive (vocab_size non-zero)"));
  if (h.dim % h.n_heads != 0 || h.n_heads % h.n_kv_heads != 0 || (h.dim / h.n_heads) % 2 != 0)
    bad(strcat("header has dim=", h.dim, " n_heads=", h.n_heads, " n_kv_heads=", h.n_kv_heads,
               ", expected dim divisible by n_heads, n_heads by n_kv_heads, and an even head size"));
  // Guard against absurd headers before any multiplication can overflow.
  if (h.dim > (1 << 16) || h.hidden_dim > (1 << 18) || h.n_layers > 4096 || std::abs(h.vocab_size) > (1 << 24) ||
      h.seq_len > (1 << 24))
    bad(strcat("header fields are implausibly large (dim=", h.dim, " hidden_dim=", h.hidden_dim,
               " n_layers=", h.n_layers, " vocab_size=", h.vocab_size, " seq_len=", h.seq_len, ")"));
  Llama2Config c;
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.vocab_size = std::abs(h.vocab_size);
  c.max_seq_len = h.seq_len;
  c.tied_embeddings = h.vocab_size > 0;
  const uint64_t hd = uint64_t(c.head_dim());
  const uint64_t floats = uint64_t(ParameterLayout(c).total()) + 2ull * c.max_seq_len * (hd / 2);
  const uint64_t expected = kLlama2cHeaderBytes + 4 * floats;
  if (size != expected)
    fail(strcat(path, ": llama2.c v0 header (dim=", c.dim, " hidden_dim=", c.hidden_dim,
                " n_layers=", c.n_layers, " n_heads=", c.n_heads, " n_kv_heads=", c.n_kv_heads,
                " vocab_size=", h.vocab_size, " seq_len=", c.max_seq_len, ") implies ", expected,
                " bytes but the file has ", size, " bytes",
                size < expected ? " (truncated?)" : " (trailing data or a different format?)"));
  return c;
}

Llama2cHeader read_llama2c_header(const std::string& path, std::ifstream& in) {
  Llama2cHeader h{};
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  if (!in) fail(strcat(path, ": too short for a llama2.c model header (28 bytes)"));
  return h;
}

// The llama2.c v0 tensor order: each tensor kind for all layers, then the final norm.
// `visit(offset, numel)` is called with the flat-buffer ranges in file order.
template <class Visit>
void llama2c_order(const ParameterLayout& layout, const Llama2Config& c, Visit visit) {
  const size_t C = c.dim, F = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
  visit(layout.tok_embeddings, V * C);
  for (const auto& L : layout.layers) visit(L.attention_norm, C);
  for (const auto& L : layout.layers) visit(L.wq, C * C);
  for (const auto& L : layout.layers) visit(L.wk, KV * C);
  for (const auto& L : layout.layers) visit(L.wv, KV * C);
  for (const auto& L : layout.layers) visit(L.wo, C * C);
  for (const auto& L : layout.layers) visit(L.ffn_norm, C);
  for (const auto& L : layout.layers) visit(L.w1, F * C);
  for (const auto& L : layout.layers) visit(L.w2, C * F);
  for (const auto& L : layout.layers) visit(L.w3, F * C);
  visit(layout.norm, C);
}

ModelData load_llama2c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(strcat(path, ": cannot open"));
  const Llama2cHeader h = read_llama2c_header(path, in);
  ModelData m;
  m.config = llama2c_config(path, h, file_size(path));
  const ParameterLayout layout(m.config);
  m.params.assign(layout.total(), 0.f);
  auto read = [&](float* dst, size_t n) {
    in.read(reinterpret_cast<char*>(dst), std::streamsize(n * sizeof(float)));
    if (!in) fail(strcat(path, ": unexpected end of file while reading tensors"));
  };
  llama2c_order(layout, m.config, [&](size_t off, size_t n) { read(m.params.data() + off, n); });
  const size_t half = size_t(m.config.head_dim() / 2) * m.config.max_seq_len;
  auto& re = m.extras["freq_cis_real"];
  auto& im = m.extras["freq_cis_imag"];
  re.resize(half);
  im.resize(half);
  read(re.data(), half);
  read(im.data(), half);
  if (!m.config.tied_embeddings) read(m.params.data() + layout.output, size_t(m.config.vocab_size) * m.config.dim);
  return m;
}

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
  return f == ModelFormat::kHdf5 ? "hdf5" : "llama2c";
}

ModelFormat detect_model_format(const std::string& path) {
  if (!file_exists(path)) fail(strcat(path, ": model file not found"));
  if (h5::is_hdf5_file(path)) return ModelFormat::kHdf5;
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
  if (detect_model_format(path) == ModelFormat::kHdf5) {
    h5::File f = h5::File::open_read(path);
    return read_config_attrs(f);
  }
  std::ifstream in(path, std::ios::binary);
  return llama2c_config(path, read_llama2c_header(path, in), file_size(path));
}

ModelData load_model(const std::string& path) {
  return detect_model_format(path) == ModelFormat::kHdf5 ? load_hdf5(path) : load_llama2c(path);
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

void save_model_llama2c(const std::string& path, const ModelData& m) {
  const Llama2Config& c = m.config;
  const ParameterLayout layout(c);
  LT_CHECK(m.params.size() == layout.total(), "parameter buffer size mismatch");
  std::string out;
  const Llama2cHeader h{c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                        c.tied_embeddings ? c.vocab_size : -c.vocab_size, c.max_seq_len};
  out.append(reinterpret_cast<const char*>(&h), sizeof h);
  auto put = [&](const float* p, size_t n) {
    out.append(reinterpret_cast<const char*>(p), n * sizeof(float));
  };
  llama2c_order(layout, c, [&](size_t off, size_t n) { put(m.params.data() + off, n); });
  const int half_hd = c.head_dim() / 2;
  const size_t half = size_t(half_hd) * c.max_seq_len;
  auto re = m.extras.find("freq_cis_real");
  auto im = m.extras.find("freq_cis_imag");
  if (re != m.extras.end() && im != m.extras.end() && re->second.size() == half && im->second.size() == half) {
    put(re->second.data(), half);
    put(im->second.data(), half);
  } else {
    // As llama2.c's precompute_freqs_cis: freqs = 1 / theta^(2i/hd) in float32, angle = t * freq.
    std::vector<float> cr(half), ci(half);
    for (int t = 0; t < c.max_seq_len; ++t)
      for (int i = 0; i < half_hd; ++i) {
        const float freq = 1.0f / std::pow(c.rope_theta, float(2 * i) / float(c.head_dim()));
        const float angle = float(t) * freq;
        cr[size_t(t) * half_hd + i] = std::cos(angle);
        ci[size_t(t) * half_hd + i] = std::sin(angle);
      }
    put(cr.data(), half);
    put(ci.data(), half);
  }
  if (!c.tied_embeddings) put(m.params.data() + layout.output, size_t(c.vocab_size) * c.dim);
  write_file_atomic(path, out);
}

}  // namespace lt
