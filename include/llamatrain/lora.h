// LoRA (Hu et al. 2021, as HF PEFT applies it): low-rank adapters on the linear layers of a frozen
// Llama 2. A targeted product y = W x becomes y = W x + (alpha / r) * B (A dropout(x)) with A (r, in)
// and B (out, r); A starts Kaiming-uniform (PEFT's bound 1/sqrt(in)), B at zero, so an untrained
// adapter leaves the model as it was. Only A and B are trained: the base has no gradient and no
// optimizer state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llamatrain/config.h"

namespace lt {

// The products an adapter can sit on, in a layer's order (Meta names; HF: q_proj, k_proj, v_proj,
// o_proj, gate_proj, down_proj, up_proj).
enum class LoraTarget { kWq, kWk, kWv, kWo, kW1, kW2, kW3 };
constexpr int kLoraTargets = 7;
const char* lora_target_name(LoraTarget t);     // "wq" ...
const char* lora_target_hf_name(LoraTarget t);  // "q_proj" ...

struct LoraConfig {
  int rank = 0;         // 0: no LoRA
  float alpha = 16.f;   // the update's scale is alpha / rank (PEFT's lora_alpha)
  float dropout = 0.f;  // on the adapter's input only, while training
  uint32_t targets = 0x7f;  // bit t: LoraTarget t carries an adapter (default all seven)
  bool enabled() const { return rank > 0; }
  bool has(LoraTarget t) const { return (targets >> int(t)) & 1u; }
  float scale() const { return alpha / float(rank); }
  // Throws lt::Error naming the field at fault.
  void validate() const;
};
// "wq,wk,wv,wo,w1,w2,w3" (Meta or HF names, any order, no repeats) -> targets bits; throws
// lt::Error naming the unknown or repeated entry.
uint32_t parse_lora_targets(const std::string& list);
std::string lora_targets_string(uint32_t targets);  // "wq,wk,..." in layer order

// One adapter: the product of layer `layer` it sits on, its sizes, and where its A and B are in the
// adapters' flat buffer.
struct LoraSite {
  int layer = 0;
  LoraTarget target = LoraTarget::kWq;
  int in = 0, out = 0;   // the product's (in_features, out_features)
  size_t a = 0, b = 0;   // offsets of A (rank, in) and B (out, rank)
};

// Every adapter of a model, layer by layer in LoraTarget order, over one flat buffer (A then B per
// site).
struct TensorInfo;  // model.h
class TensorTable;
class LoraLayout {
 public:
  LoraLayout(const Llama2Config& model, const LoraConfig& lora);
  const LoraConfig& config() const { return lora_; }
  const std::vector<LoraSite>& sites() const { return sites_; }
  size_t total() const { return total_; }
  // The site on (layer, target), or null where that product has no adapter.
  const LoraSite* find(int layer, LoraTarget t) const;
  // A at Kaiming-uniform (U(-1/sqrt(in), 1/sqrt(in)), PEFT's default) from seed, B zero.
  void init(uint64_t seed, float* params) const;
  void init(uint64_t seed, double* params) const;
  // The adapters as the optimizer sees them: A and B of each, named "layers.3.attention.wq.lora_A" ...,
  // all weight-decayed (as HF's Trainer decays PEFT's).
  std::vector<TensorInfo> tensors() const;
  TensorTable table() const;  // tensors() over total(): what a checkpoint of the adapters holds
  // What the adapters change in a token's training FLOPs (Llama2Config::flops_per_token's 6 per
  // parameter): the base's weight gradients are not computed (-2 per base parameter) and the
  // adapters' products cost 6 per adapter parameter. The planner and train's MFU add it.
  double flops_per_token_delta() const { return 6.0 * double(total_) - 2.0 * double(base_params_); }
  // PEFT's tensor names for an adapter of the HF export: "base_model.model.model.layers.3.self_attn.
  // q_proj.lora_A.weight" (a) or "...lora_B.weight".
  static std::string peft_name(const LoraSite& s, bool b);

 private:
  LoraConfig lora_;
  std::vector<LoraSite> sites_;
  std::vector<int> index_;  // layer * kLoraTargets + target -> site, or -1
  size_t total_ = 0;
  int64_t base_params_ = 0;  // the model's (Llama2Config::num_parameters)
};

class ParameterLayout;
// W += (alpha / r) * B A for every adapter: the merged base (params laid out by `model`) then
// computes what base + adapters did.
void merge_lora(const LoraLayout& lora, const float* adapters, const ParameterLayout& model, float* params);
void merge_lora(const LoraLayout& lora, const double* adapters, const ParameterLayout& model, double* params);
// The same for the one tensor of the model at flat offset `offset` (nothing where it has no
// adapter): `tensor` holds its weights (a model written a tensor at a time from ZeRO 3's shards).
void merge_lora_tensor(const LoraLayout& lora, const float* adapters, const ParameterLayout& model, size_t offset,
                       float* tensor);

}  // namespace lt
