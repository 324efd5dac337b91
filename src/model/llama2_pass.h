// The Llama 2 forward and backward pass, written once over an op set (DESIGN.md: "forward/backward
// orchestration written once"). Ops is a backend policy:
//   Act    activations and activation gradients (CPU: T; CUDA: bf16)
//   Param  working weights                        (CPU: T; CUDA: bf16)
//   Grad   parameter gradients                    (CPU: T; CUDA: fp32)
//   Stat   per-row statistics: rstd, lse, losses  (CPU: T; CUDA: fp32)
//   Buffer<U>  owning storage where the backend's ops can read it (resize(n), data())
// and members with the argument order and =/+= semantics of ops_cpu.h (outputs, caches, inputs,
// weights, sizes). The Batch given to forward/backward holds pointers the ops can read (device
// pointers for the CUDA backend); token ids are checked by the caller before (check_batch_ids).
// Backward walks the layers in reverse with the same names as forward; d<name> is the gradient
// of <name>. Backward also tells the ops when parameter gradients are final
// (ops.grads_final_from(offset): every gradient at flat offset >= offset), so a backend can start
// reducing them across ranks while the layers below are still running.
#pragma once
#include <cstddef>
#include <cstdint>

#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/model.h"

namespace lt {

// Throws lt::Error naming the position when an input id, or a target id that carries loss, is
// outside [0, V). Host pointers.
void check_batch_ids(const Batch& batch, int V);

template <class Ops>
class Llama2Pass {
 public:
  using Act = typename Ops::Act;
  using Param = typename Ops::Param;
  using Grad = typename Ops::Grad;
  using Stat = typename Ops::Stat;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  Llama2Pass(const Llama2Config& cfg, const ParameterLayout& layout) : cfg_(cfg), layout_(layout) {}

  // Bytes of the buffers ensure_activations(B, Tn) allocates.
  size_t activation_bytes(int B, int Tn) const {
    const size_t N = size_t(B) * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
    const size_t L = cfg_.n_layers, V = cfg_.vocab_size, H = cfg_.n_heads;
    const size_t act_per_layer = N * (5 * C + 2 * KV + 3 * F);
    const size_t stat_per_layer = 2 * N + size_t(B) * H * Tn;
    const size_t act = (L + 1) * N * C + L * act_per_layer + N * C + N * V + N * (4 * C + 2 * KV + 3 * F);
    const size_t stat = L * stat_per_layer + 3 * N;
    return sizeof(Act) * act + sizeof(Stat) * stat;
  }

  // Forward through the logits and, when the batch has targets, the masked cross-entropy: returns
  // the summed loss (0 without targets) and keeps the activations for backward().
  double forward(Ops& ops, const Param* P, const Batch& batch) {
    const int B = batch.B, Tn = batch.T;
    ensure_activations(B, Tn);
    Activations& a = acts_;
    const int N = B * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
    const int H = cfg_.n_heads, KVH = cfg_.n_kv_heads, hd = cfg_.head_dim(), V = cfg_.vocab_size;

    ops.embedding_forward(a.x.data(), batch.inputs, P + layout_.tok_embeddings, N, C);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const auto& W = layout_.layers[size_t(l)];
      const size_t oC = size_t(l) * N * C, oKV = size_t(l) * N * KV, oF = size_t(l) * N * F;
      Act* x = a.x.data() + oC;               // (N,C) layer input
      Act* xn1 = a.xn1.data() + oC;           // (N,C)
      Stat* rstd1 = a.rstd1.data() + size_t(l) * N;
      Act* q = a.q.data() + oC;               // (B,Tn,H,hd)
      Act* k = a.k.data() + oKV;              // (B,Tn,KVH,hd)
      Act* v = a.v.data() + oKV;              // (B,Tn,KVH,hd)
      Act* att = a.att.data() + oC;           // (B,Tn,H,hd)
      Stat* lse = a.lse.data() + size_t(l) * B * H * Tn;  // (B,H,Tn)
      Act* x2 = a.x2.data() + oC;             // (N,C) after the attention residual
      Act* xn2 = a.xn2.data() + oC;
      Stat* rstd2 = a.rstd2.data() + size_t(l) * N;
      Act* h1 = a.h1.data() + oF;             // (N,F)
      Act* h3 = a.h3.data() + oF;
      Act* hs = a.hs.data() + oF;
      Act* x_next = a.x.data() + oC + size_t(N) * C;

      ops.rmsnorm_forward(xn1, rstd1, x, P + W.attention_norm, N, C, cfg_.norm_eps);
      ops.matmul_forward(q, xn1, P + W.wq, N, C, C);
      ops.matmul_forward(k, xn1, P + W.wk, N, C, KV);
      ops.matmul_forward(v, xn1, P + W.wv, N, C, KV);
      ops.rope_forward(q, q, batch.pos, B, Tn, H, hd, cfg_.rope_theta);
      ops.rope_forward(k, k, batch.pos, B, Tn, KVH, hd, cfg_.rope_theta);
      ops.attention_forward(att, lse, q, k, v, batch.seg_start, B, Tn, H, KVH, hd);
      ops.matmul_forward(a.dtmp.data(), att, P + W.wo, N, C, C);
      ops.residual_add(x2, x, a.dtmp.data(), size_t(N) * C);
      ops.rmsnorm_forward(xn2, rstd2, x2, P + W.ffn_norm, N, C, cfg_.norm_eps);
      ops.matmul_forward(h1, xn2, P + W.w1, N, C, F);
      ops.matmul_forward(h3, xn2, P + W.w3, N, C, F);
      ops.swiglu_forward(hs, h1, h3, N, F);
      ops.matmul_forward(a.dtmp.data(), hs, P + W.w2, N, F, C);
      ops.residual_add(x_next, x2, a.dtmp.data(), size_t(N) * C);
    }
    const Act* x_last = a.x.data() + size_t(cfg_.n_layers) * N * C;
    ops.rmsnorm_forward(a.xf.data(), a.rstdf.data(), x_last, P + layout_.norm, N, C, cfg_.norm_eps);
    ops.matmul_forward(a.logits.data(), a.xf.data(), P + layout_.output, N, C, V);
    if (!batch.targets) return 0.0;
    return ops.crossentropy_forward(a.losses.data(), a.lse_ce.data(), a.logits.data(), batch.targets,
                                    batch.loss_mask, N, V);
  }

  // Backward of (dloss * summed loss) after forward() on the same batch: += into G.
  void backward(Ops& ops, const Param* P, Grad* G, const Batch& batch, float dloss) {
    const int B = batch.B, Tn = batch.T;
    Activations& a = acts_;
    LT_CHECK(a.B == B && a.Tn == Tn, "backward() without a matching forward()");
    LT_CHECK(batch.targets, "backward() needs targets");
    const int N = B * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
    const int H = cfg_.n_heads, KVH = cfg_.n_kv_heads, hd = cfg_.head_dim(), V = cfg_.vocab_size;

    Act* dlogits = a.logits.data();  // in place: (N,V)
    ops.crossentropy_backward(dlogits, a.logits.data(), a.lse_ce.data(), batch.targets, batch.loss_mask,
                              dloss, N, V);
    Act* dxf = a.dtmp.data();
    ops.matmul_backward(dxf, G + layout_.output, dlogits, a.xf.data(), P + layout_.output, N, C, V);
    Act* dx = a.dx.data();  // gradient of the residual stream, (N,C)
    const Act* x_last = a.x.data() + size_t(cfg_.n_layers) * N * C;
    ops.rmsnorm_backward(dx, G + layout_.norm, dxf, x_last, P + layout_.norm, a.rstdf.data(), N, C);
    ops.grads_final_from(layout_.norm);  // the final norm and the output head (untied) are done

    for (int l = cfg_.n_layers - 1; l >= 0; --l) {
      const auto& W = layout_.layers[size_t(l)];
      const size_t oC = size_t(l) * N * C, oKV = size_t(l) * N * KV, oF = size_t(l) * N * F;
      const Act* x = a.x.data() + oC;
      const Act* xn1 = a.xn1.data() + oC;
      const Stat* rstd1 = a.rstd1.data() + size_t(l) * N;
      const Act* q = a.q.data() + oC;
      const Act* k = a.k.data() + oKV;
      const Act* v = a.v.data() + oKV;
      const Act* att = a.att.data() + oC;
      const Stat* lse = a.lse.data() + size_t(l) * B * H * Tn;
      const Act* x2 = a.x2.data() + oC;
      const Act* xn2 = a.xn2.data() + oC;
      const Stat* rstd2 = a.rstd2.data() + size_t(l) * N;
      const Act* h1 = a.h1.data() + oF;
      const Act* h3 = a.h3.data() + oF;
      const Act* hs = a.hs.data() + oF;
      Act* dhs = a.dhs.data();
      Act* dh1 = a.dh1.data();
      Act* dh3 = a.dh3.data();
      Act* dxn = a.dtmp.data();
      Act* dtmp = a.dtmp2.data();

      // x_next = x2 + w2(swiglu(w1 xn2, w3 xn2)): dx flows to x2 unchanged and into the FFN.
      ops.matmul_backward(dhs, G + W.w2, dx, hs, P + W.w2, N, F, C);
      ops.swiglu_backward(dh1, dh3, dhs, h1, h3, N, F);
      ops.matmul_backward(dxn, G + W.w1, dh1, xn2, P + W.w1, N, C, F);
      ops.matmul_backward(dtmp, G + W.w3, dh3, xn2, P + W.w3, N, C, F);
      ops.residual_add(dxn, dxn, dtmp, size_t(N) * C);
      ops.rmsnorm_backward(dtmp, G + W.ffn_norm, dxn, x2, P + W.ffn_norm, rstd2, N, C);
      ops.residual_add(dx, dx, dtmp, size_t(N) * C);  // dx is now d(x2)

      // x2 = x + wo(attention(rope(wq xn1), rope(wk xn1), wv xn1))
      Act* datt = a.datt.data();
      Act* dq = a.dq.data();
      Act* dk = a.dk.data();
      Act* dv = a.dv.data();
      ops.matmul_backward(datt, G + W.wo, dx, att, P + W.wo, N, C, C);
      ops.attention_backward(dq, dk, dv, datt, att, lse, q, k, v, batch.seg_start, B, Tn, H, KVH, hd);
      ops.rope_backward(dq, dq, batch.pos, B, Tn, H, hd, cfg_.rope_theta);
      ops.rope_backward(dk, dk, batch.pos, B, Tn, KVH, hd, cfg_.rope_theta);
      ops.matmul_backward(dxn, G + W.wq, dq, xn1, P + W.wq, N, C, C);
      ops.matmul_backward(dtmp, G + W.wk, dk, xn1, P + W.wk, N, C, KV);
      ops.residual_add(dxn, dxn, dtmp, size_t(N) * C);
      ops.matmul_backward(dtmp, G + W.wv, dv, xn1, P + W.wv, N, C, KV);
      ops.residual_add(dxn, dxn, dtmp, size_t(N) * C);
      ops.rmsnorm_backward(dtmp, G + W.attention_norm, dxn, x, P + W.attention_norm, rstd1, N, C);
      ops.residual_add(dx, dx, dtmp, size_t(N) * C);  // dx is now d(x), the layer input
      ops.grads_final_from(W.attention_norm);  // layer l's tensors start at its attention_norm
    }
    ops.embedding_backward(G + layout_.tok_embeddings, dx, batch.inputs, N, V, C);
    ops.grads_final_from(0);
  }

  // The last forward()'s logits (N,V) and per-token losses (N), in the backend's storage.
  // backward() overwrites the logits with their gradient.
  const Act* logits() const { return acts_.logits.data(); }
  const Stat* token_losses() const { return acts_.losses.data(); }

 private:
  struct Activations {
    int B = 0, Tn = 0;
    Buffer<Act> x;  // (L+1, N, C) residual stream: input of each layer, final
    Buffer<Act> xn1, q, k, v, att, x2, xn2, h1, h3, hs;  // per layer
    Buffer<Stat> rstd1, lse, rstd2;                       // per layer
    Buffer<Act> xf;                                       // final norm (N,C)
    Buffer<Stat> rstdf;                                   // (N)
    Buffer<Act> logits;                                   // (N,V); dlogits in place during backward
    Buffer<Stat> losses, lse_ce;                          // (N)
    // backward scratch
    Buffer<Act> dx, dtmp, dtmp2, datt, dq, dk, dv, dh1, dh3, dhs;
  };

  void ensure_activations(int B, int Tn) {
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

  Llama2Config cfg_;
  ParameterLayout layout_;
  Activations acts_;
};

}  // namespace lt
