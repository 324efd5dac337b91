#include "llamatrain/config.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "llamatrain/error.h"

namespace lt {

namespace {

Llama2Config make(int dim, int hidden, int layers, int heads, int kv_heads, int vocab, int seq,
                  bool tied) {
  Llama2Config c;
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.tied_embeddings = tied;
  return c;
}

// Sizes from Meta's params.json (Llama 2) and llama2.c's model table (stories*).
const std::map<std::string, Llama2Config>& presets() {
  static const std::map<std::string, Llama2Config> table = {
      {"llama2-7b", make(4096, 11008, 32, 32, 32, 32000, 4096, false)},
      {"llama2-13b", make(5120, 13824, 40, 40, 40, 32000, 4096, false)},
      {"llama2-70b", make(8192, 28672, 80, 64, 8, 32000, 4096, false)},
      {"stories260k", make(64, 172, 5, 8, 4, 512, 512, true)},
      {"stories15m", make(288, 768, 6, 6, 6, 32000, 256, true)},
      {"stories42m", make(512, 1376, 8, 8, 8, 32000, 1024, true)},
      {"stories110m", make(768, 2048, 12, 12, 12, 32000, 1024, true)},
      // For tests and the embedded default: GQA, untied head, small enough for CI.
      {"tiny", make(64, 160, 2, 4, 2, 512, 128, false)},
  };
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, cfg] : presets()) names.push_back(name);
  return names;
}

Llama2Config preset_config(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string valid;
    for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    fail(strcat("unknown model config '", name, "' (expected one of: ", valid, ")"));
  }
  return it->second;
}

void Llama2Config::validate() const {
  auto positive = [](const char* field, int v) {
    if (v <= 0) fail(strcat("model config: ", field, " = ", v, ", expected > 0"));
  };
  positive("dim", dim);
  positive("hidden_dim", hidden_dim);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  if (dim % n_heads != 0)
    fail(strcat("model config: dim = ", dim, " is not a multiple of n_heads = ", n_heads));
  if (head_dim() % 2 != 0)
    fail(strcat("model config: head_dim = ", head_dim(), " must be even for RoPE"));
  if (n_heads % n_kv_heads != 0)
    fail(strcat("model config: n_heads = ", n_heads, " is not a multiple of n_kv_heads = ",
                n_kv_heads));
  if (!(norm_eps > 0.f)) fail(strcat("model config: norm_eps = ", norm_eps, ", expected > 0"));
  if (!(rope_theta > 0.f)) fail(strcat("model config: rope_theta = ", rope_theta, ", expected > 0"));
}

std::string Llama2Config::to_string() const {
  return strcat("dim=", dim, " hidden_dim=", hidden_dim, " n_layers=", n_layers,
                " n_heads=", n_heads, " n_kv_heads=", n_kv_heads, " vocab_size=", vocab_size,
                " max_seq_len=", max_seq_len, " norm_eps=", norm_eps, " rope_theta=", rope_theta,
                " tied_embeddings=", tied_embeddings ? "true" : "false");
}

Llama2Config Llama2Config::from_string(const std::string& s, const std::string& origin) {
  std::map<std::string, std::string> kv;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = std::min(s.find(' ', pos), s.size());
    const std::string item = s.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) fail(strcat(origin, ": model config item '", item, "' is not key=value"));
    kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  auto get = [&](const char* key) -> const std::string& {
    auto it = kv.find(key);
    if (it == kv.end()) fail(strcat(origin, ": model config '", s, "' lacks ", key));
    return it->second;
  };
  auto num = [&](const char* key) {
    const std::string& v = get(key);
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') fail(strcat(origin, ": model config ", key, "=", v, " is not a number"));
    return d;
  };
  Llama2Config c;
  c.dim = int(num("dim"));
  c.hidden_dim = int(num("hidden_dim"));
  c.n_layers = int(num("n_layers"));
  c.n_heads = int(num("n_heads"));
  c.n_kv_heads = int(num("n_kv_heads"));
  c.vocab_size = int(num("vocab_size"));
  c.max_seq_len = int(num("max_seq_len"));
  c.norm_eps = float(num("norm_eps"));
  c.rope_theta = float(num("rope_theta"));
  const std::string& tied = get("tied_embeddings");
  if (tied != "true" && tied != "false")
    fail(strcat(origin, ": model config tied_embeddings=", tied, ", expected true or false"));
  c.tied_embeddings = tied == "true";
  try {
    c.validate();
  } catch (const Error& e) {
    fail(strcat(origin, ": ", e.what()));
  }
  return c;
}

int64_t Llama2Config::num_parameters() const {
  const int64_t C = dim, F = hidden_dim, V = vocab_size, kv = kv_dim();
  const int64_t per_layer = 2 * C + C * C * 2 + 2 * C * kv + 3 * C * F;
  return V * C + n_layers * per_layer + C + (tied_embeddings ? 0 : V * C);
}

double Llama2Config::flops_per_token(int seq_len) const {
  // 6 FLOPs per parameter per token (forward 2 + backward 4) excluding the embedding lookup,
  // plus attention scores and values: 12 * L * C * T (forward 4LCT, backward 8LCT; causal
  // masking is not discounted, matching the PaLM/Megatron MFU convention).
  const double n = double(num_parameters()) - double(vocab_size) * dim * (tied_embeddings ? 0 : 1);
  return 6.0 * n + 12.0 * n_layers * double(dim) * seq_len;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kAttn: return "attn";
    case Recompute::kFull: return "full";
  }
  return "?";
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

const char* attention_name(Attention a) { return a == Attention::kCudnn ? "cudnn" : "native"; }

}  // namespace lt
