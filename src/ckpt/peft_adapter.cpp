// PEFT's LoRA adapter directory (peft_adapter.h).
#include "llamatrain/peft_adapter.h"

#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/json_read.h"
#include "llamatrain/safetensors.h"

namespace lt {

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// B's rows of an adapter on q_proj / k_proj are permuted per head as the HF export permutes wq, wk.
int permuted_heads(const Llama2Config& m, LoraTarget t) {
  if (t == LoraTarget::kWq) return m.n_heads;
  if (t == LoraTarget::kWk) return m.n_kv_heads;
  return 0;
}

// What PEFT could have set that changes the adapter's arithmetic and that we do not apply.
void refuse_unsupported(const nlohmann::json& j, const std::string& origin) {
  auto is_set = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
           !(it->is_object() && it->empty()) && !(it->is_array() && it->empty());
  };
  if (j.value("peft_type", std::string()) != "LORA")
    fail(strcat(origin, ": peft_type: expected \"LORA\" (got ", j.contains("peft_type") ? j["peft_type"].dump() : "none", ")"));
  if (j.contains("bias") && j["bias"] != "none") fail(strcat(origin, ": bias: only \"none\" is supported (got ", j["bias"].dump(), ")"));
  for (const char* key : {"use_dora", "use_rslora", "rank_pattern", "alpha_pattern", "modules_to_save",
                          "layers_to_transform", "fan_in_fan_out"})
    if (is_set(key)) fail(strcat(origin, ": ", key, " is set (", j[key].dump(), "); llamatrain applies plain LoRA only"));
}

LoraConfig config_from_json(const nlohmann::json& j, const std::string& origin) {
  refuse_unsupported(j, origin);
  LoraConfig c;
  try {
    c.rank = j.at("r").get<int>();
    c.alpha = j.at("lora_alpha").get<float>();
    c.dropout = j.value("lora_dropout", 0.f);
    const nlohmann::json& t = j.at("target_modules");
    std::string list;
    if (t.is_string()) {
      list = t.get<std::string>();
    } else {
      for (const auto& e : t) list += (list.empty() ? "" : ",") + e.get<std::string>();
    }
    c.targets = parse_lora_targets(list);
  } catch (const nlohmann::json::exception& e) {
    fail(strcat(origin, ": expected r (integer), lora_alpha (number), target_modules (list of names): ", e.what()));
  } catch (const Error& e) {
    fail(strcat(origin, ": ", e.what()));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(strcat(origin, ": ", e.what()));
  }
  return c;
}

}  // namespace

void write_peft_adapter(const std::string& dir, const Llama2Config& model, const LoraLayout& lora, const float* params,
                        const std::string& base_model) {
  make_dirs(dir);
  const LoraConfig& c = lora.config();
  const uint64_t r = uint64_t(c.rank);
  std::vector<std::vector<float>> permuted;  // B of q_proj / k_proj in HF's row order
  permuted.reserve(lora.sites().size());
  std::vector<safetensors::TensorToWrite> tensors;
  for (const LoraSite& s : lora.sites()) {
    tensors.push_back({LoraLayout::peft_name(s, false), {r, uint64_t(s.in)}, params + s.a});
    const float* b = params + s.b;
    if (const int heads = permuted_heads(model, s.target)) {
      permuted.emplace_back(size_t(s.out) * r);
      hf_permute_from_meta(permuted.back().data(), b, heads, model.head_dim(), c.rank);
      b = permuted.back().data();
    }
    tensors.push_back({LoraLayout::peft_name(s, true), {uint64_t(s.out), r}, b});
  }
  safetensors::write_file(dir + "/" + kWeightsFile, tensors, safetensors::Dtype::kF32, {{"format", "pt"}});
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  j["r"] = c.rank;
  j["lora_alpha"] = c.alpha;
  j["lora_dropout"] = c.dropout;
  std::vector<std::string> targets;
  for (int t = 0; t < kLoraTargets; ++t)
    if (c.has(LoraTarget(t))) targets.push_back(lora_target_hf_name(LoraTarget(t)));
  j["target_modules"] = targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  write_file_atomic(dir + "/" + kConfigFile, j.dump(2) + "\n");
}

PeftAdapter read_peft_adapter(const std::string& dir, const Llama2Config& model) {
  require_directory(dir, "--lora");
  const std::string config_path = dir + "/" + kConfigFile, weights_path = dir + "/" + kWeightsFile;
  require_regular_file(config_path, "--lora");
  require_regular_file(weights_path, "--lora (a .bin adapter is not read: save it with safe_serialization)");
  PeftAdapter a;
  a.config = config_from_json(parse_json_object_text(read_file_bytes(config_path), config_path), config_path);
  const LoraLayout layout(model, a.config);
  a.params.assign(layout.total(), 0.f);
  const safetensors::Reader reader(weights_path);
  size_t used = 0;
  std::vector<float> tmp;
  for (const LoraSite& s : layout.sites())
    for (bool is_b : {false, true}) {
      const std::string name = LoraLayout::peft_name(s, is_b);
      const safetensors::TensorEntry* t = reader.header().find(name);
      if (!t) fail(strcat(weights_path, ": tensor ", name, " is missing (", config_path, " targets it)"));
      const std::vector<uint64_t> want = is_b ? std::vector<uint64_t>{uint64_t(s.out), uint64_t(a.config.rank)}
                                              : std::vector<uint64_t>{uint64_t(a.config.rank), uint64_t(s.in)};
      if (t->shape != want)
        fail(strcat(weights_path, ": tensor ", name, " has shape ", nlohmann::json(t->shape).dump(), ", expected ",
                    nlohmann::json(want).dump(), " for this model and r = ", a.config.rank));
      float* out = a.params.data() + (is_b ? s.b : s.a);
      const int heads = is_b ? permuted_heads(model, s.target) : 0;
      if (!heads) {
        reader.read_f32(*t, out);
      } else {
        tmp.resize(size_t(t->numel()));
        reader.read_f32(*t, tmp.data());
        hf_permute_to_meta(out, tmp.data(), heads, model.head_dim(), a.config.rank);
      }
      ++used;
    }
  if (used != reader.header().tensors.size())
    fail(strcat(weights_path, ": holds ", reader.header().tensors.size(), " tensors, ", used,
                " of them adapters of the targets in ", config_path, " (an adapter of another model, or of more modules?)"));
  return a;
}

}  // namespace lt
