// llama2.c v0 .bin reading and writing (LLAMA2C_BIN_FORMAT.md).
#include "llamatrain/llama2c.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/model.h"

namespace lt {

// The longest max_seq_len a llama2.c file may declare (reader and writer alike).
constexpr int kMaxSeqLen = 1 << 24;
namespace {

struct Llama2cHeader {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};
static_assert(sizeof(Llama2cHeader) == kLlama2cHeaderBytes);

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

// Fills a model whose config was checked against the source's size; `read(dst, n)` copies the
// next n floats of the file (after the header) and throws at a premature end.
template <class Read>
ModelData llama2c_read_body(const Llama2Config& config, Read read) {
  ModelData m;
  m.config = config;
  const ParameterLayout layout(m.config);
  m.params.assign(layout.total(), 0.f);
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

}  // namespace

Llama2Config llama2c_parse_header(std::string_view header, uint64_t size, const std::string& path) {
  if (header.size() < kLlama2cHeaderBytes) fail(strcat(path, ": too short for a llama2.c model header (28 bytes)"));
  Llama2cHeader h{};
  std::memcpy(&h, header.data(), sizeof h);
  auto bad = [&](const std::string& what) { fail(strcat(path, ": not a valid llama2.c v0 model: ", what)); };
  if (h.dim <= 0 || h.hidden_dim <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 || h.seq_len <= 0 ||
      h.vocab_size == 0)
    bad(strcat("header fields dim=", h.dim, " hidden_dim=", h.hidden_dim, " n_layers=", h.n_layers,
               " n_heads=", h.n_heads, " n_kv_heads=", h.n_kv_heads, " vocab_size=", h.vocab_size,
               " seq_len=", h.seq_len, " must be positive (vocab_size non-zero)"));
  if (h.dim % h.n_heads != 0 || h.n_heads % h.n_kv_heads != 0 || (h.dim / h.n_heads) % 2 != 0)
    bad(strcat("header has dim=", h.dim, " n_heads=", h.n_heads, " n_kv_heads=", h.n_kv_heads,
               ", expected dim divisible by n_heads, n_heads by n_kv_heads, and an even head size"));
  // Guard against absurd headers before any multiplication can overflow. (vocab_size is
  // compared on both sides because abs(INT32_MIN) is undefined.)
  if (h.dim > (1 << 16) || h.hidden_dim > (1 << 18) || h.n_layers > 4096 || h.vocab_size > (1 << 24) ||
      h.vocab_size < -(1 << 24) || h.seq_len > kMaxSeqLen)
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
  // The tensor sizes of llama2c_order in closed form (cheaper than building the layout for a
  // header that is about to be refused), plus the two RoPE tables. The bounds above keep every
  // term far below 2^64.
  const uint64_t C = uint64_t(c.dim), F = uint64_t(c.hidden_dim), KV = uint64_t(c.kv_dim()), L = uint64_t(c.n_layers),
                 V = uint64_t(c.vocab_size), hd = uint64_t(c.head_dim());
  const uint64_t per_layer = C + C * C + 2 * KV * C + C * C + C + 3 * F * C;
  const uint64_t floats = V * C * (c.tied_embeddings ? 1 : 2) + L * per_layer + C + 2ull * c.max_seq_len * (hd / 2);
  const uint64_t expected = kLlama2cHeaderBytes + 4 * floats;
  if (size != expected)
    fail(strcat(path, ": llama2.c v0 header (dim=", c.dim, " hidden_dim=", c.hidden_dim, " n_layers=", c.n_layers,
                " n_heads=", c.n_heads, " n_kv_heads=", c.n_kv_heads, " vocab_size=", h.vocab_size,
                " seq_len=", c.max_seq_len, ") implies ", expected, " bytes but the file has ", size, " bytes",
                size < expected ? " (truncated?)" : " (trailing data or a different format?)"));
  return c;
}

ModelData llama2c_parse(std::string_view file, const std::string& origin) {
  const Llama2Config c = llama2c_parse_header(file, file.size(), origin);
  size_t pos = kLlama2cHeaderBytes;
  return llama2c_read_body(c, [&](float* dst, size_t n) {
    // Cannot fail once the header matched the size; checked anyway so a future format change
    // cannot turn into an out-of-bounds read.
    LT_CHECK(n * sizeof(float) <= file.size() - pos, origin, ": llama2.c body shorter than its header implies");
    std::memcpy(dst, file.data() + pos, n * sizeof(float));
    pos += n * sizeof(float);
  });
}

ModelData load_llama2c(const std::string& path) {
  refuse_special_file(path, "model file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(strcat(path, ": cannot open"));
  char header[kLlama2cHeaderBytes];
  in.read(header, sizeof header);
  const Llama2Config c = llama2c_parse_header(std::string_view(header, size_t(in.gcount())), file_size(path), path);
  return llama2c_read_body(c, [&](float* dst, size_t n) {
    in.read(reinterpret_cast<char*>(dst), std::streamsize(n * sizeof(float)));
    if (!in) fail(strcat(path, ": unexpected end of file while reading tensors"));
  });
}

std::string llama2c_serialize(const ModelData& m) {
  const Llama2Config& c = m.config;
  // The format stores RoPE tables of max_seq_len x head_dim / 2 floats twice; its reader (above)
  // refuses a longer one, so the writer does too, before building them.
  if (c.max_seq_len > kMaxSeqLen)
    fail(strcat("llama2.c output: the model's max_seq_len ", c.max_seq_len, " is above the ", kMaxSeqLen,
                " the llama2.c format holds (its RoPE tables alone would be ",
                2.0 * c.max_seq_len * (c.head_dim() / 2) * 4 / (1 << 30),
                " GiB); convert to hdf5 or hf, or train with a smaller --max-seq-len"));
  const ParameterLayout layout(c);
  LT_CHECK(m.params.size() == layout.total(), "parameter buffer size mismatch");
  std::string out;
  const Llama2cHeader h{c.dim,        c.hidden_dim, c.n_layers,
                        c.n_heads,    c.n_kv_heads, c.tied_embeddings ? c.vocab_size : -c.vocab_size,
                        c.max_seq_len};
  out.append(reinterpret_cast<const char*>(&h), sizeof h);
  auto put = [&](const float* p, size_t n) { out.append(reinterpret_cast<const char*>(p), n * sizeof(float)); };
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
    // (PyTorch's cos/sin differ from libm's in the last bit for ~10% of entries, which is why
    // the tables read from a .bin travel along as extras.)
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
  return out;
}

void save_model_llama2c(const std::string& path, const ModelData& m) { write_file_atomic(path, llama2c_serialize(m)); }

}  // namespace lt
