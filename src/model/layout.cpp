#include "llamatrain/error.h"
#include "llamatrain/model.h"

namespace lt {

size_t ParameterLayout::add(const std::string& name, std::vector<int64_t> shape, bool decay) {
  TensorInfo t;
  t.name = name;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= size_t(d);
  t.shape = std::move(shape);
  t.offset = total_;
  t.weight_decay = decay;
  total_ += t.numel;
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

ParameterLayout::ParameterLayout(const Llama2Config& cfg) {
  cfg.validate();
  const int64_t C = cfg.dim, F = cfg.hidden_dim, V = cfg.vocab_size, KV = cfg.kv_dim();
  tok_embeddings = add("tok_embeddings.weight", {V, C}, true);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer L;
    L.attention_norm = add(p + "attention_norm.weight", {C}, false);
    L.wq = add(p + "attention.wq.weight", {C, C}, true);
    L.wk = add(p + "attention.wk.weight", {KV, C}, true);
    L.wv = add(p + "attention.wv.weight", {KV, C}, true);
    L.wo = add(p + "attention.wo.weight", {C, C}, true);
    L.ffn_norm = add(p + "ffn_norm.weight", {C}, false);
    L.w1 = add(p + "feed_forward.w1.weight", {F, C}, true);
    L.w2 = add(p + "feed_forward.w2.weight", {C, F}, true);
    L.w3 = add(p + "feed_forward.w3.weight", {F, C}, true);
    layers.push_back(L);
  }
  norm = add("norm.weight", {C}, false);
  output = cfg.tied_embeddings ? tok_embeddings : add("output.weight", {V, C}, true);
  blocks.push_back({tok_embeddings, layers.empty() ? norm : layers[0].attention_norm});
  for (size_t l = 0; l < layers.size(); ++l)
    blocks.push_back({layers[l].attention_norm, l + 1 < layers.size() ? layers[l + 1].attention_norm : norm});
  blocks.push_back({norm, total_});
}

const TensorInfo* ParameterLayout::try_find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorInfo& ParameterLayout::find(const std::string& name) const {
  const TensorInfo* t = try_find(name);
  if (!t) fail(strcat("model has no tensor named '", name, "'"));
  return *t;
}

}  // namespace lt
