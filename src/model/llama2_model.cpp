// Forward and backward of Llama 2 over the CPU op set. Backward walks the layers in reverse
// with the same names as forward; d<name> is the gradient of <name>.
#include <algorithm>
#include <cmath>

#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/rng.h"

namespace lt {

template <class T>
Llama2ModelT<T>::Llama2ModelT(const Llama2Config& cfg) : cfg_(cfg), layout_(cfg) {
  params_.assign(layout_.total(), T(0));
}

template <class T>
void Llama2ModelT<T>::allocate_grads() { grads_.assign(layout_.total(), T(0)); }

template <class T>
void Llama2ModelT<T>::zero_grads() { std::fill(grads_.begin(), grads_.end(), T(0)); }

template <class T>
void Llama2ModelT<T>::init_random(uint64_t seed) {
  Rng rng(seed);
  const double std_base = 0.02;
  const double std_resid = 0.02 / std::sqrt(2.0 * cfg_.n_layers);
  for (const auto& t : layout_.tensors()) {
    T* p = params_.data() + t.offset;
    if (!t.weight_decay) {  // norm weights
      std::fill(p, p + t.numel, T(1));
      continue;
    }
    const bool resid = t.name.find("attention.wo") != std::string::npos ||
                       t.name.find("feed_forward.w2") != std::string::npos;
    const double sd = resid ? std_resid : std_base;
    for (size_t i = 0; i < t.numel; ++i) p[i] = T(sd * rng.normal());
  }
}

template <class T>
size_t Llama2ModelT<T>::activation_bytes(int B, int Tn) const {
  const size_t N = size_t(B) * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
  const size_t L = cfg_.n_layers, V = cfg_.vocab_size, H = cfg_.n_heads;
  const size_t per_layer = N * (5 * C + 2 * KV + 3 * F + 2) + size_t(B) * H * Tn;
  const size_t scratch = N * (4 * C + 2 * KV + 3 * F);
  return sizeof(T) * ((L + 1) * N * C + L * per_layer + N * (C + 3) + N * V + scratch);
}

template <class T>
void Llama2ModelT<T>::ensure_activations(int B, int Tn) {
  Activations& a = acts_;
  if (a.B == B && a.Tn == Tn) return;
  const size_t N = size_t(B) * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
  const size_t L = cfg_.n_layers, V = cfg_.vocab_size, H = cfg_.n_heads;
  a = Activations();
  a.B = B;
  a.Tn = Tn;
  a.x.resize((L + 1) * N * C);
  a.xn1.resize(L * N * C);
  a.rstd1.resize(L * N);
  a.q.resize(L * N * C);
  a.k.resize(L * N * KV);
  a.v.resize(L * N * KV);
  a.att.resize(L * N * C);
  a.lse.resize(L * B * H * Tn);
  a.x2.resize(L * N * C);
  a.xn2.resize(L * N * C);
  a.rstd2.resize(L * N);
  a.h1.resize(L * N * F);
  a.h3.resize(L * N * F);
  a.hs.resize(L * N * F);
  a.xf.resize(N * C);
  a.rstdf.resize(N);
  a.logits.resize(N * V);
  a.losses.resize(N);
  a.lse_ce.resize(N);
  a.dx.resize(N * C);
  a.dtmp.resize(N * C);
  a.dtmp2.resize(N * C);
  a.datt.resize(N * C);
  a.dq.resize(N * C);
  a.dk.resize(N * KV);
  a.dv.resize(N * KV);
  a.dh1.resize(N * F);
  a.dh3.resize(N * F);
  a.dhs.resize(N * F);
}

template <class T>
double Llama2ModelT<T>::forward(const Batch& batch, T* token_losses) {
  const int B = batch.B, Tn = batch.T;
  LT_CHECK(B > 0 && Tn > 0, "empty batch");
  LT_CHECK(Tn <= cfg_.max_seq_len, "sequence length ", Tn, " exceeds the model's max_seq_len ",
           cfg_.max_seq_len);
  ensure_activations(B, Tn);
  Activations& a = acts_;
  const int N = B * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
  const int H = cfg_.n_heads, KVH = cfg_.n_kv_heads, hd = cfg_.head_dim(), V = cfg_.vocab_size;
  const T* P = params_.data();

  for (int i = 0; i < N; ++i)
    if (batch.inputs[i] < 0 || batch.inputs[i] >= V)
      fail(strcat("token id ", batch.inputs[i], " at position ", i, " is outside the model's vocab_size ", V));

  cpu::embedding_forward(a.x.data(), batch.inputs, P + layout_.tok_embeddings, N, C);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const auto& W = layout_.layers[size_t(l)];
    const size_t oC = size_t(l) * N * C, oKV = size_t(l) * N * KV, oF = size_t(l) * N * F;
    T* x = a.x.data() + oC;               // (N,C) layer input
    T* xn1 = a.xn1.data() + oC;           // (N,C)
    T* rstd1 = a.rstd1.data() + size_t(l) * N;
    T* q = a.q.data() + oC;               // (B,Tn,H,hd)
    T* k = a.k.data() + oKV;              // (B,Tn,KVH,hd)
    T* v = a.v.data() + oKV;              // (B,Tn,KVH,hd)
    T* att = a.att.data() + oC;           // (B,Tn,H,hd)
    T* lse = a.lse.data() + size_t(l) * B * H * Tn;  // (B,H,Tn)
    T* x2 = a.x2.data() + oC;             // (N,C) after the attention residual
    T* xn2 = a.xn2.data() + oC;
    T* rstd2 = a.rstd2.data() + size_t(l) * N;
    T* h1 = a.h1.data() + oF;             // (N,F)
    T* h3 = a.h3.data() + oF;
    T* hs = a.hs.data() + oF;
    T* x_next = a.x.data() + oC + size_t(N) * C;

    cpu::rmsnorm_forward(xn1, rstd1, x, P + W.attention_norm, N, C, cfg_.norm_eps);
    cpu::matmul_forward(q, xn1, P + W.wq, N, C, C);
    cpu::matmul_forward(k, xn1, P + W.wk, N, C, KV);
    cpu::matmul_forward(v, xn1, P + W.wv, N, C, KV);
    cpu::rope_forward(q, q, batch.pos, B, Tn, H, hd, cfg_.rope_theta);
    cpu::rope_forward(k, k, batch.pos, B, Tn, KVH, hd, cfg_.rope_theta);
    cpu::attention_forward(att, lse, q, k, v, batch.seg_start, B, Tn, H, KVH, hd);
    cpu::matmul_forward(a.dtmp.data(), att, P + W.wo, N, C, C);
    cpu::residual_add(x2, x, a.dtmp.data(), size_t(N) * C);
    cpu::rmsnorm_forward(xn2, rstd2, x2, P + W.ffn_norm, N, C, cfg_.norm_eps);
    cpu::matmul_forward(h1, xn2, P + W.w1, N, C, F);
    cpu::matmul_forward(h3, xn2, P + W.w3, N, C, F);
    cpu::swiglu_forward(hs, h1, h3, N, F);
    cpu::matmul_forward(a.dtmp.data(), hs, P + W.w2, N, F, C);
    cpu::residual_add(x_next, x2, a.dtmp.data(), size_t(N) * C);
  }
  const T* x_last = a.x.data() + size_t(cfg_.n_layers) * N * C;
  cpu::rmsnorm_forward(a.xf.data(), a.rstdf.data(), x_last, P + layout_.norm, N, C, cfg_.norm_eps);
  cpu::matmul_forward(a.logits.data(), a.xf.data(), P + layout_.output, N, C, V);
  if (!batch.targets) return 0.0;

  std::vector<uint8_t> all_ones;
  const uint8_t* mask = batch.loss_mask;
  if (!mask) {
    all_ones.assign(size_t(N), 1);
    mask = all_ones.data();
  }
  for (int i = 0; i < N; ++i)
    if (mask[i] && (batch.targets[i] < 0 || batch.targets[i] >= V))
      fail(strcat("target id ", batch.targets[i], " at position ", i,
                  " is outside the model's vocab_size ", V));
  const double loss_sum = cpu::crossentropy_forward(a.losses.data(), a.lse_ce.data(), a.logits.data(),
                                                    batch.targets, mask, N, V);
  if (token_losses) std::copy(a.losses.begin(), a.losses.end(), token_losses);
  return loss_sum;
}

template <class T>
void Llama2ModelT<T>::backward(const Batch& batch, float dloss) {
  const int B = batch.B, Tn = batch.T;
  Activations& a = acts_;
  LT_CHECK(a.B == B && a.Tn == Tn, "backward() without a matching forward()");
  LT_CHECK(!grads_.empty(), "backward() before allocate_grads()");
  LT_CHECK(batch.targets, "backward() needs targets");
  const int N = B * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
  const int H = cfg_.n_heads, KVH = cfg_.n_kv_heads, hd = cfg_.head_dim(), V = cfg_.vocab_size;
  const T* P = params_.data();
  T* G = grads_.data();

  std::vector<uint8_t> all_ones;
  const uint8_t* mask = batch.loss_mask;
  if (!mask) {
    all_ones.assign(size_t(N), 1);
    mask = all_ones.data();
  }
  T* dlogits = a.logits.data();  // in place: (N,V)
  cpu::crossentropy_backward(dlogits, a.logits.data(), a.lse_ce.data(), batch.targets, mask, dloss, N, V);
  T* dxf = a.dtmp.data();
  cpu::matmul_backward(dxf, G + layout_.output, dlogits, a.xf.data(), P + layout_.output, N, C, V);
  T* dx = a.dx.data();  // gradient of the residual stream, (N,C)
  const T* x_last = a.x.data() + size_t(cfg_.n_layers) * N * C;
  cpu::rmsnorm_backward(dx, G + layout_.norm, dxf, x_last, P + layout_.norm, a.rstdf.data(), N, C);

  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    const auto& W = layout_.layers[size_t(l)];
    const size_t oC = size_t(l) * N * C, oKV = size_t(l) * N * KV, oF = size_t(l) * N * F;
    const T* x = a.x.data() + oC;
    const T* xn1 = a.xn1.data() + oC;
    const T* rstd1 = a.rstd1.data() + size_t(l) * N;
    const T* q = a.q.data() + oC;
    const T* k = a.k.data() + oKV;
    const T* v = a.v.data() + oKV;
    const T* att = a.att.data() + oC;
    const T* lse = a.lse.data() + size_t(l) * B * H * Tn;
    const T* x2 = a.x2.data() + oC;
    const T* xn2 = a.xn2.data() + oC;
    const T* rstd2 = a.rstd2.data() + size_t(l) * N;
    const T* h1 = a.h1.data() + oF;
    const T* h3 = a.h3.data() + oF;
    const T* hs = a.hs.data() + oF;
    T* dhs = a.dhs.data();
    T* dh1 = a.dh1.data();
    T* dh3 = a.dh3.data();
    T* dxn = a.dtmp.data();
    T* dtmp = a.dtmp2.data();

    // x_next = x2 + w2(swiglu(w1 xn2, w3 xn2)): dx flows to x2 unchanged and into the FFN.
    cpu::matmul_backward(dhs, G + W.w2, dx, hs, P + W.w2, N, F, C);
    cpu::swiglu_backward(dh1, dh3, dhs, h1, h3, N, F);
    cpu::matmul_backward(dxn, G + W.w1, dh1, xn2, P + W.w1, N, C, F);
    cpu::matmul_backward(dtmp, G + W.w3, dh3, xn2, P + W.w3, N, C, F);
    cpu::residual_add(dxn, dxn, dtmp, size_t(N) * C);
    cpu::rmsnorm_backward(dtmp, G + W.ffn_norm, dxn, x2, P + W.ffn_norm, rstd2, N, C);
    cpu::residual_add(dx, dx, dtmp, size_t(N) * C);  // dx is now d(x2)

    // x2 = x + wo(attention(rope(wq xn1), rope(wk xn1), wv xn1))
    T* datt = a.datt.data();
    T* dq = a.dq.data();
    T* dk = a.dk.data();
    T* dv = a.dv.data();
    cpu::matmul_backward(datt, G + W.wo, dx, att, P + W.wo, N, C, C);
    cpu::attention_backward(dq, dk, dv, datt, att, lse, q, k, v, batch.seg_start, B, Tn, H, KVH, hd);
    cpu::rope_backward(dq, dq, batch.pos, B, Tn, H, hd, cfg_.rope_theta);
    cpu::rope_backward(dk, dk, batch.pos, B, Tn, KVH, hd, cfg_.rope_theta);
    cpu::matmul_backward(dxn, G + W.wq, dq, xn1, P + W.wq, N, C, C);
    cpu::matmul_backward(dtmp, G + W.wk, dk, xn1, P + W.wk, N, C, KV);
    cpu::residual_add(dxn, dxn, dtmp, size_t(N) * C);
    cpu::matmul_backward(dtmp, G + W.wv, dv, xn1, P + W.wv, N, C, KV);
    cpu::residual_add(dxn, dxn, dtmp, size_t(N) * C);
    cpu::rmsnorm_backward(dtmp, G + W.attention_norm, dxn, x, P + W.attention_norm, rstd1, N, C);
    cpu::residual_add(dx, dx, dtmp, size_t(N) * C);  // dx is now d(x), the layer input
  }
  cpu::embedding_backward(G + layout_.tok_embeddings, dx, batch.inputs, N, V, C);
}

template class Llama2ModelT<float>;
template class Llama2ModelT<double>;

}  // namespace lt
