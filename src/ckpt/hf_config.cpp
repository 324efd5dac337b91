// Hugging Face config.json (hf_model.h): reading a Llama configuration from it, with every field
// checked and bounded, and writing one that transformers reads. Its own file so that the config
// fuzz target (tests/fuzz) compiles only this, not the whole import/export.
#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/json_read.h"

namespace lt {
namespace {
struct ConfigReader {
  const nlohmann::json& j;
  const std::string& origin;

  const nlohmann::json* find(const char* key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, const std::string& what) const {
    fail(strcat(origin, ": field \"", key, "\" ", what));
  }
  // Required unless a default is given; bounded so later size arithmetic cannot overflow.
  int integer(const char* key, int64_t lo, int64_t hi, const int* def = nullptr) const {
    const nlohmann::json* v = find(key);
    if (!v) {
      if (def) return *def;
      fail(strcat(origin, ": missing field \"", key, "\""));
    }
    if (!v->is_number_integer()) bad(key, strcat("= ", v->dump(), ", expected an integer"));
    // An unsigned value above INT64_MAX is out of range whatever the bounds.
    const int64_t x =
        v->is_number_unsigned() ? int64_t(std::min<uint64_t>(v->get<uint64_t>(), uint64_t(hi) + 1)) : v->get<int64_t>();
    if (x < lo || x > hi) bad(key, strcat("= ", v->dump(), ", expected an integer in [", lo, ", ", hi, "]"));
    return int(x);
  }
  // A positive float: the value must fit a float before it is converted (a double beyond
  // FLT_MAX converted to float is undefined behaviour).
  float positive(const char* key, float def) const {
    const nlohmann::json* v = find(key);
    if (!v) return def;
    if (!v->is_number()) bad(key, strcat("= ", v->dump(), ", expected a number"));
    const double x = v->get<double>();
    if (!(x > 0 && x <= double(FLT_MAX))) bad(key, strcat("= ", v->dump(), ", expected a positive float"));
    return float(x);
  }
  bool boolean(const char* key, bool def) const {
    const nlohmann::json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) bad(key, strcat("= ", v->dump(), ", expected true or false"));
    return v->get<bool>();
  }
};

// The shortest decimal that reads back as the same float: 1e-05 rather than 9.99999974738e-06.
double shortest_double(float f) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf - 1, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

Llama2Config hf_config_from_json(const std::string& text, const std::string& origin) {
  const nlohmann::json j = parse_json_object_text(text, origin);
  const ConfigReader r{j, origin};
  if (const auto* a = r.find("architectures")) {
    bool llama = false;
    if (a->is_array())
      for (const auto& x : *a) llama = llama || (x.is_string() && x.get<std::string>() == "LlamaForCausalLM");
    if (!llama) r.bad("architectures", strcat("= ", a->dump(), ", expected [\"LlamaForCausalLM\"]"));
  }
  if (const auto* t = r.find("model_type"); t && !(t->is_string() && t->get<std::string>() == "llama"))
    r.bad("model_type", strcat("= ", t->dump(), ", expected \"llama\""));
  if (const auto* a = r.find("hidden_act"); a && !(a->is_string() && a->get<std::string>() == "silu"))
    r.bad("hidden_act", strcat("= ", a->dump(), ", only \"silu\" (SwiGLU) is supported"));
  if (const auto* s = r.find("rope_scaling"))
    r.bad("rope_scaling", strcat("= ", s->dump(), ": scaled RoPE is not supported"));
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (r.boolean(key, false)) r.bad(key, "= true: Llama 2 has no biases; not supported");

  Llama2Config c;
  // Bounds as for llama2.c headers: generous for real models, small enough that products of
  // them fit in 64 bits.
  c.dim = r.integer("hidden_size", 1, 1 << 16);
  c.hidden_dim = r.integer("intermediate_size", 1, 1 << 18);
  c.n_layers = r.integer("num_hidden_layers", 1, 4096);
  c.n_heads = r.integer("num_attention_heads", 1, 1 << 16);
  c.n_kv_heads = r.integer("num_key_value_heads", 1, 1 << 16, &c.n_heads);  // HF: absent = no GQA
  c.vocab_size = r.integer("vocab_size", 1, 1 << 24);
  const int kDefaultPositions = 2048;  // transformers' LlamaConfig default
  c.max_seq_len = r.integer("max_position_embeddings", 1, 1 << 24, &kDefaultPositions);
  c.norm_eps = r.positive("rms_norm_eps", 1e-6f);  // transformers' default
  c.rope_theta = r.positive("rope_theta", 10000.f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", false);
  // Newer configs state head_dim; the Llama 2 family always has hidden_size / num_attention_heads.
  if (r.find("head_dim") && c.dim % c.n_heads == 0) r.integer("head_dim", c.dim / c.n_heads, c.dim / c.n_heads);
  try {
    c.validate();
  } catch (const Error& e) {
    fail(strcat(origin, ": ", e.what()));
  }
  return c;
}

std::string hf_config_to_json(const Llama2Config& c, bool bf16) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim();
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = shortest_double(c.norm_eps);
  j["rope_theta"] = shortest_double(c.rope_theta);
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  // Marks the file as ours: a later export may replace it (save_model_hf), not someone else's.
  j["llamatrain_version"] = LLAMATRAIN_VERSION;
  return j.dump(2) + "\n";
}

}  // namespace lt
