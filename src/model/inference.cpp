#include "llamatrain/inference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt {

CpuDecoder::CpuDecoder(const Llama2Model& model, int max_len) : model_(model), max_len_(max_len) {
  const Llama2Config& c = model.config();
  LT_CHECK(max_len > 0 && max_len <= c.max_seq_len, "decoder length ", max_len,
           " outside (0, max_seq_len=", c.max_seq_len, "]");
  const size_t cache = size_t(c.n_layers) * max_len * c.kv_dim();
  key_cache_.assign(cache, 0.f);
  value_cache_.assign(cache, 0.f);
  x_.resize(c.dim);
  xn_.resize(c.dim);
  q_.resize(c.dim);
  att_.resize(c.dim);
  tmp_.resize(c.dim);
  h1_.resize(c.hidden_dim);
  h3_.resize(c.hidden_dim);
  logits_.resize(c.vocab_size);
}

const std::vector<float>& CpuDecoder::step(int32_t token, int pos) {
  const Llama2Config& c = model_.config();
  const ParameterLayout& L = model_.layout();
  const float* P = model_.params().data();
  const int C = c.dim, F = c.hidden_dim, KV = c.kv_dim(), H = c.n_heads, hd = c.head_dim();
  LT_CHECK(pos >= 0 && pos < max_len_, "position ", pos, " outside the decoder's length ", max_len_);
  LT_CHECK(token >= 0 && token < c.vocab_size, "token ", token, " outside vocab_size ", c.vocab_size);
  const int32_t position = pos;
  float rstd;

  cpu::embedding_forward(x_.data(), &token, P + L.tok_embeddings, 1, C);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& W = L.layers[size_t(l)];
    float* kc = key_cache_.data() + (size_t(l) * max_len_ + pos) * KV;    // (KV) at pos
    float* vc = value_cache_.data() + (size_t(l) * max_len_ + pos) * KV;
    cpu::rmsnorm_forward(xn_.data(), &rstd, x_.data(), P + W.attention_norm, 1, C, c.norm_eps);
    cpu::matmul_forward(q_.data(), xn_.data(), P + W.wq, 1, C, C);
    cpu::matmul_forward(kc, xn_.data(), P + W.wk, 1, C, KV);
    cpu::matmul_forward(vc, xn_.data(), P + W.wv, 1, C, KV);
    cpu::rope_forward(q_.data(), q_.data(), &position, 1, 1, H, hd, c.rope_theta);
    cpu::rope_forward(kc, kc, &position, 1, 1, c.n_kv_heads, hd, c.rope_theta);
    const float* layer_k = key_cache_.data() + size_t(l) * max_len_ * KV;
    const float* layer_v = value_cache_.data() + size_t(l) * max_len_ * KV;
    cpu::attention_decode(att_.data(), q_.data(), layer_k, layer_v, KV, pos + 1, H, c.n_kv_heads, hd);
    cpu::matmul_forward(tmp_.data(), att_.data(), P + W.wo, 1, C, C);
    cpu::residual_add(x_.data(), x_.data(), tmp_.data(), size_t(C));
    cpu::rmsnorm_forward(xn_.data(), &rstd, x_.data(), P + W.ffn_norm, 1, C, c.norm_eps);
    cpu::matmul_forward(h1_.data(), xn_.data(), P + W.w1, 1, C, F);
    cpu::matmul_forward(h3_.data(), xn_.data(), P + W.w3, 1, C, F);
    cpu::swiglu_forward(h1_.data(), h1_.data(), h3_.data(), 1, F);
    cpu::matmul_forward(tmp_.data(), h1_.data(), P + W.w2, 1, F, C);
    cpu::residual_add(x_.data(), x_.data(), tmp_.data(), size_t(C));
  }
  cpu::rmsnorm_forward(xn_.data(), &rstd, x_.data(), P + L.norm, 1, C, c.norm_eps);
  cpu::matmul_forward(logits_.data(), xn_.data(), P + L.output, 1, C, c.vocab_size);
  return logits_;
}

int32_t Sampler::sample(const std::vector<float>& logits) {
  const int V = int(logits.size());
  // No garbage out: NaN/inf logits (the activations overflowed) would pick an arbitrary token.
  for (int i = 0; i < V; ++i)
    if (!std::isfinite(logits[size_t(i)]))
      fail(strcat("the model produced a non-finite logit (", logits[size_t(i)], " for token ", i,
                  "): its activations overflowed; no token can be sampled"));
  if (temperature_ <= 0.f)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<double> p(static_cast<size_t>(V));
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += (p[size_t(i)] = std::exp(double(logits[size_t(i)] - mx) / temperature_));
  for (auto& x : p) x /= sum;
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int n = V;
  if (top_p_ > 0.f && top_p_ < 1.f) {
    // Nucleus: most probable first (ties by index), keep the prefix whose mass reaches top_p.
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b;
    });
    double mass = 0;
    for (n = 0; n < V;) {
      mass += p[size_t(idx[size_t(n)])];
      ++n;
      if (mass >= top_p_) break;
    }
    double kept = 0;
    for (int i = 0; i < n; ++i) kept += p[size_t(idx[size_t(i)])];
    for (int i = 0; i < n; ++i) p[size_t(idx[size_t(i)])] /= kept;
  }
  const double r = rng_.uniform();
  double cdf = 0;
  for (int i = 0; i < n; ++i) {
    cdf += p[size_t(idx[size_t(i)])];
    if (r < cdf) return idx[size_t(i)];
  }
  return idx[size_t(n - 1)];
}

}  // namespace lt
