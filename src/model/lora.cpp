// LoRA adapters' sizes, names and initial values (lora.h).
#include "llamatrain/lora.h"

#include <cmath>

#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/rng.h"

namespace lt {

namespace {

constexpr const char* kMetaNames[kLoraTargets] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
constexpr const char* kHfNames[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                "gate_proj", "down_proj", "up_proj"};

// (in, out) of target t's product.
std::pair<int, int> product_shape(const Llama2Config& c, LoraTarget t) {
  const int C = c.dim, F = c.hidden_dim, KV = c.kv_dim();
  switch (t) {
    case LoraTarget::kWq: case LoraTarget::kWo: return {C, C};
    case LoraTarget::kWk: case LoraTarget::kWv: return {C, KV};
    case LoraTarget::kW1: case LoraTarget::kW3: return {C, F};
    case LoraTarget::kW2: return {F, C};
  }
  return {0, 0};
}

template <class T>
void init_adapters(const LoraLayout& layout, uint64_t seed, T* p) {
  const int r = layout.config().rank;
  Rng rng(seed);
  for (const LoraSite& s : layout.sites()) {
    const double bound = 1.0 / std::sqrt(double(s.in));
    for (size_t i = 0; i < size_t(r) * s.in; ++i) p[s.a + i] = T((2.0 * rng.uniform() - 1.0) * bound);
    for (size_t i = 0; i < size_t(s.out) * r; ++i) p[s.b + i] = T(0);
  }
}

// The flat offset of the product an adapter site changes.
size_t site_offset(const LoraSite& site, const ParameterLayout& model) {
  const ParameterLayout::Layer& L = model.layers[size_t(site.layer)];
  const size_t offsets[kLoraTargets] = {L.wq, L.wk, L.wv, L.wo, L.w1, L.w2, L.w3};
  return offsets[int(site.target)];
}

// W (out, in) += s * B A of one adapter.
template <class T>
void merge_site(const LoraLayout& lora, const LoraSite& site, const T* p, T* W) {
  const int r = lora.config().rank;
  const double s = lora.config().scale();
  const T* A = p + site.a;  // (r, in)
  const T* B = p + site.b;  // (out, r)
#pragma omp parallel for schedule(static)
  for (int o = 0; o < site.out; ++o)
    for (int i = 0; i < site.in; ++i) {
      double d = 0;
      for (int k = 0; k < r; ++k) d += double(B[size_t(o) * r + k]) * A[size_t(k) * site.in + i];
      W[size_t(o) * site.in + i] += T(s * d);
    }
}

template <class T>
void merge_adapters(const LoraLayout& lora, const T* p, const ParameterLayout& model, T* w) {
  for (const LoraSite& site : lora.sites()) merge_site(lora, site, p, w + site_offset(site, model));
}

}  // namespace

void merge_lora(const LoraLayout& lora, const float* adapters, const ParameterLayout& model, float* params) {
  merge_adapters(lora, adapters, model, params);
}
void merge_lora(const LoraLayout& lora, const double* adapters, const ParameterLayout& model, double* params) {
  merge_adapters(lora, adapters, model, params);
}

void merge_lora_tensor(const LoraLayout& lora, const float* adapters, const ParameterLayout& model, size_t offset,
                       float* tensor) {
  for (const LoraSite& site : lora.sites())
    if (site_offset(site, model) == offset) merge_site(lora, site, adapters, tensor);
}

const char* lora_target_name(LoraTarget t) { return kMetaNames[int(t)]; }
const char* lora_target_hf_name(LoraTarget t) { return kHfNames[int(t)]; }

void LoraConfig::validate() const {
  if (rank < 1 || rank > 4096) fail(strcat("--lora-rank: expected 1 <= R <= 4096 (got ", rank, ")"));
  if (!(alpha > 0) || !std::isfinite(alpha)) fail(strcat("--lora-alpha: expected a positive number (got ", alpha, ")"));
  if (!(dropout >= 0 && dropout < 1)) fail(strcat("--lora-dropout: expected 0 <= P < 1 (got ", dropout, ")"));
  if ((targets & 0x7fu) == 0 || (targets & ~0x7fu)) fail("--lora-targets: expected at least one of wq,wk,wv,wo,w1,w2,w3");
}

uint32_t parse_lora_targets(const std::string& list) {
  uint32_t bits = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    int found = -1;
    for (int t = 0; t < kLoraTargets; ++t)
      if (name == kMetaNames[t] || name == kHfNames[t]) found = t;
    if (found < 0)
      fail(strcat("--lora-targets: '", name, "' is not one of wq,wk,wv,wo,w1,w2,w3 (or q_proj,k_proj,v_proj,o_proj,",
                  "gate_proj,down_proj,up_proj)"));
    if (bits & (1u << found)) fail(strcat("--lora-targets: '", name, "' is named twice"));
    bits |= 1u << found;
    pos = comma + 1;
  }
  return bits;
}

std::string lora_targets_string(uint32_t targets) {
  std::string out;
  for (int t = 0; t < kLoraTargets; ++t)
    if (targets & (1u << t)) out += std::string(out.empty() ? "" : ",") + kMetaNames[t];
  return out;
}

LoraLayout::LoraLayout(const Llama2Config& model, const LoraConfig& lora)
    : lora_(lora), base_params_(model.num_parameters()) {
  lora.validate();
  index_.assign(size_t(model.n_layers) * kLoraTargets, -1);
  for (int l = 0; l < model.n_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      if (!lora.has(LoraTarget(t))) continue;
      LoraSite s;
      s.layer = l;
      s.target = LoraTarget(t);
      std::tie(s.in, s.out) = product_shape(model, s.target);
      s.a = total_;
      s.b = s.a + size_t(lora.rank) * s.in;
      total_ = s.b + size_t(s.out) * lora.rank;
      index_[size_t(l) * kLoraTargets + t] = int(sites_.size());
      sites_.push_back(s);
    }
}

const LoraSite* LoraLayout::find(int layer, LoraTarget t) const {
  const int i = index_[size_t(layer) * kLoraTargets + int(t)];
  return i < 0 ? nullptr : &sites_[size_t(i)];
}

void LoraLayout::init(uint64_t seed, float* params) const { init_adapters(*this, seed, params); }
void LoraLayout::init(uint64_t seed, double* params) const { init_adapters(*this, seed, params); }

std::vector<TensorInfo> LoraLayout::tensors() const {
  std::vector<TensorInfo> out;
  const int64_t r = lora_.rank;
  for (const LoraSite& s : sites_) {
    const bool attention = s.target <= LoraTarget::kWo;
    const std::string base = strcat("layers.", s.layer, attention ? ".attention." : ".feed_forward.",
                                    kMetaNames[int(s.target)]);
    out.push_back({base + ".lora_A", {r, s.in}, s.a, size_t(r) * s.in, true});
    out.push_back({base + ".lora_B", {s.out, r}, s.b, size_t(s.out) * r, true});
  }
  return out;
}

TensorTable LoraLayout::table() const { return TensorTable(tensors(), total_); }

std::string LoraLayout::peft_name(const LoraSite& s, bool b) {
  const bool attention = s.target <= LoraTarget::kWo;
  return strcat("base_model.model.model.layers.", s.layer, attention ? ".self_attn." : ".mlp.",
                kHfNames[int(s.target)], b ? ".lora_B.weight" : ".lora_A.weight");
}

}  // namespace lt
