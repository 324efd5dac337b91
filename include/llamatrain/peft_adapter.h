// A LoRA adapter in Hugging Face PEFT's directory format, for the HF export of the base model
// (hf_model.h): adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout, target_modules)
// and adapter_model.safetensors (base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight,
// (r, in); ...lora_B.weight, (out, r)). The HF export stores wq and wk with their rows permuted per
// head (RoPE's half-split order), so B of an adapter on q_proj or k_proj is permuted the same way
// on the way out and back on the way in; A is not.
#pragma once
#include <string>
#include <vector>

#include "llamatrain/config.h"
#include "llamatrain/lora.h"

namespace lt {

struct PeftAdapter {
  LoraConfig config;
  std::vector<float> params;  // over LoraLayout(model, config), Meta's row order
};

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (fp32), each published
// atomically; base_model names the base in the config (base_model_name_or_path).
void write_peft_adapter(const std::string& dir, const Llama2Config& model, const LoraLayout& lora,
                        const float* params, const std::string& base_model);
// Reads an adapter for `model`; throws lt::Error naming the file and the field or tensor at fault
// (what PEFT options it cannot apply: bias, DoRA, rsLoRA, per-module ranks, modules_to_save, layer
// subsets; a target outside the seven products; a missing, extra or misshapen tensor).
PeftAdapter read_peft_adapter(const std::string& dir, const Llama2Config& model);

}  // namespace lt
