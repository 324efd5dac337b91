// Decoding on the CUDA backend (see cuda_decoder.h).
#include "backend/cuda/cuda_decoder.h"

#include "attention_decode.cuh"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN

CudaDecoder::CudaDecoder(const Llama2Model& model, int max_len)
    : cfg_(model.config()), layout_(cfg_), max_len_(max_len) {
  LT_CHECK(max_len > 0 && max_len <= cfg_.max_seq_len, "decoder length ", max_len, " outside (0, max_seq_len=",
           cfg_.max_seq_len, "]");
  LT_CHECK(max_len <= kAttentionDecodeMaxPositions, "the device decoder caches at most ",
           kAttentionDecodeMaxPositions, " positions; asked for ", max_len);
  params_.resize(layout_.total());
  copy_to_device_bf16(params_.data(), model.params().data(), layout_.total());
  const size_t C = cfg_.dim, F = cfg_.hidden_dim, cache = size_t(cfg_.n_layers) * max_len * cfg_.kv_dim();
  k_cache_.resize(cache);
  v_cache_.resize(cache);
  for (auto* b : {&x_, &xn_, &q_, &att_, &tmp_}) b->resize(C);
  for (auto* b : {&h1_, &h3_, &hs_}) b->resize(F);
  rstd_.resize(1);
  logits_.resize(size_t(cfg_.vocab_size));
  ids_.resize(2);
  host_logits_.resize(size_t(cfg_.vocab_size));
}

void CudaDecoder::layer_step(int l, int pos) {
  const auto& W = layout_.layers[size_t(l)];
  const __nv_bfloat16* P = params_.data();
  const int C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim(), H = cfg_.n_heads, KVH = cfg_.n_kv_heads;
  const int hd = cfg_.head_dim();
  __nv_bfloat16* layer_k = k_cache_.data() + size_t(l) * max_len_ * KV;
  __nv_bfloat16* layer_v = v_cache_.data() + size_t(l) * max_len_ * KV;
  __nv_bfloat16* kc = layer_k + size_t(pos) * KV;  // this position's key and value
  __nv_bfloat16* vc = layer_v + size_t(pos) * KV;
  const int32_t* position = ids_.data() + 1;
  ops_.rmsnorm_forward(xn_.data(), rstd_.data(), x_.data(), P + W.attention_norm, 1, C, cfg_.norm_eps);
  ops_.matmul_forward(q_.data(), xn_.data(), P + W.wq, 1, C, C);
  ops_.matmul_forward(kc, xn_.data(), P + W.wk, 1, C, KV);
  ops_.matmul_forward(vc, xn_.data(), P + W.wv, 1, C, KV);
  ops_.rope_forward(q_.data(), q_.data(), position, 1, 1, H, hd, cfg_.rope_theta);
  ops_.rope_forward(kc, kc, position, 1, 1, KVH, hd, cfg_.rope_theta);
  AttentionDecodeParams a;
  a.out = att_.data();
  a.q = q_.data();
  a.k = layer_k;
  a.v = layer_v;
  a.kv_stride = KV;
  a.n = pos + 1;
  a.H = H;
  a.KVH = KVH;
  a.hd = hd;
  attention_decode_cuda(a, ops_.stream);
  ops_.matmul_forward(tmp_.data(), att_.data(), P + W.wo, 1, C, C);
  ops_.residual_add(x_.data(), x_.data(), tmp_.data(), size_t(C));
  ops_.rmsnorm_forward(xn_.data(), rstd_.data(), x_.data(), P + W.ffn_norm, 1, C, cfg_.norm_eps);
  ops_.matmul_forward(h1_.data(), xn_.data(), P + W.w1, 1, C, F);
  ops_.matmul_forward(h3_.data(), xn_.data(), P + W.w3, 1, C, F);
  ops_.swiglu_forward(hs_.data(), h1_.data(), h3_.data(), 1, F);
  ops_.matmul_forward(tmp_.data(), hs_.data(), P + W.w2, 1, F, C);
  ops_.residual_add(x_.data(), x_.data(), tmp_.data(), size_t(C));
}

const std::vector<float>& CudaDecoder::step(int32_t token, int pos) {
  LT_CHECK(pos >= 0 && pos < max_len_, "position ", pos, " outside the decoder's length ", max_len_);
  LT_CHECK(token >= 0 && token < cfg_.vocab_size, "token ", token, " outside vocab_size ", cfg_.vocab_size);
  const int32_t ids[2] = {token, pos};
  copy_to_device(ids_.data(), ids, sizeof ids);
  const __nv_bfloat16* P = params_.data();
  const int C = cfg_.dim;
  ops_.embedding_forward(x_.data(), ids_.data(), P + layout_.tok_embeddings, 1, C);
  for (int l = 0; l < cfg_.n_layers; ++l) layer_step(l, pos);
  ops_.rmsnorm_forward(xn_.data(), rstd_.data(), x_.data(), P + layout_.norm, 1, C, cfg_.norm_eps);
  matmul_forward_f32(logits_.data(), xn_.data(), P + layout_.output, 1, C, cfg_.vocab_size, ops_.stream);
  copy_to_host(host_logits_.data(), logits_.data(), host_logits_.size() * sizeof(float));
  return host_logits_;
}

LT_CUDA_NAMESPACE_END
