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
// of <name>. The weights and gradients are reached one parameter block at a time (param_blocks.h:
// the embeddings, each layer, the head), acquired just before use and released after, so a
// sharded model holds only the blocks in use. Over plain flat buffers (forward(ops, P, batch)),
// a block's grads_done tells the ops (ops.grads_final_from(offset): every gradient at flat
// offset >= offset is final), so a backend can start reducing them across ranks while the layers
// below are still running, and its acquire tells them a block's weights are about to be read
// (ops.weights_needed(b)), so a backend can let the reads of a block wait only for that block's
// all-gather.
//
// Activation recomputation (set_recompute) trades compute for memory. Per token, for L layers:
//   none  keeps every layer's x, xn1, q, k, v, att, x2, xn2, h1, h3, hs and rstd1, rstd2, lse.
//   attn  keeps every layer's x, xn1, x2, xn2, h1, h3, hs, rstd1, rstd2; q, k, v, att and lse get
//         one layer's worth of buffers, and backward refills them for layer l from the kept xn1
//         (wq, wk, wv, RoPE, attention forward) before the layer's backward: it drops 2C + 2kv
//         elements and H statistics per token and layer for the wq, wk, wv products (a quarter
//         of a Llama-2-7b layer's product FLOPs) and the attention forward done again.
//   full  keeps only the residual stream x, (L+1, N, C): each layer's input and the last
//         output; everything else of a layer has one layer's worth of buffers, which backward
//         refills for layer l by running the layer's forward again from x[l], up to the SwiGLU
//         (the w2 product and the residual add are skipped: their output x[l+1] is kept).
// Every mode keeps the final norm, logits and loss statistics, and the backward scratch.
// The recomputation runs the same ops on the same inputs as forward did, and every op is
// deterministic (no atomics, fixed reduction orders), so the refilled buffers are bit-identical
// to the ones forward wrote and the gradients are the same bits in all three modes.
//
// LoRA (lora.h, set_lora): each targeted product out = W x also adds s * B (A dropout(x)) (the
// linear_forward below); forward keeps u = s * A dropout(x), (N, r) per adapter, in every mode,
// and draws the dropout mask again from its stream where backward needs it (no mask is kept).
// Backward adds the adapters' gradients and their share of dx after each targeted product's own
// backward. With adapters the base is frozen: its gradients are null (no dW is computed), so
// backward writes only the adapters' gradients. A backend's ops take part with kLora = true and
// the two ops LoRA adds: scale (x *= s) and dropout (out = x * keep / (1 - p), the mask drawn from
// the element's index and a stream).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/lora.h"
#include "llamatrain/model.h"
#include "llamatrain/param_blocks.h"

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

  // Which activations backward recomputes instead of keeping (see the header). Changing the mode
  // drops the buffers: the next forward() allocates for it.
  void set_recompute(Recompute r) {
    if (r == recompute_) return;
    recompute_ = r;
    acts_ = Activations();
  }
  Recompute recompute() const { return recompute_; }

  // The adapters the next passes apply (null: none): their layout, weights W and gradients G (the
  // flat LoRA buffers; G may be null for a forward), and the dropout mask's stream (0: no dropout,
  // as in evaluation). Changing the layout drops the buffers.
  void set_lora(const LoraLayout* layout, const Param* W, Grad* G, uint64_t dropout_stream) {
    if (layout != lora_layout_) acts_ = Activations();
    lora_layout_ = layout;
    lora_W_ = W;
    lora_G_ = G;
    lora_stream_ = dropout_stream;
  }

  // Bytes of the buffers ensure_activations(B, Tn) allocates in the current mode (the same
  // for_each_buffer walk, so the two cannot disagree).
  size_t activation_bytes(int B, int Tn) const {
    Activations shape;  // allocates nothing: only its buffers' element types are used
    size_t bytes = 0;
    for_each_buffer(shape, B, Tn, [&](auto& buf, size_t n) { bytes += n * sizeof(*buf.data()); });
    return bytes;
  }

  // Forward through the logits and, when the batch has targets, the masked cross-entropy: returns
  // the summed loss (0 without targets) and keeps the activations for backward().
  double forward(Ops& ops, const Param* P, const Batch& batch) {
    FlatBlocks flat(ops, layout_, P, nullptr);
    return forward(ops, flat, batch);
  }
  double forward(Ops& ops, ParamBlocks<Param, Grad>& blocks, const Batch& batch) {
    const int B = batch.B, Tn = batch.T;
    ensure_activations(B, Tn);
    Activations& a = acts_;
    const int N = B * Tn, C = cfg_.dim, V = cfg_.vocab_size;
    const int head = layout_.head_block();

    const Weights emb = acquire(blocks, 0);
    blocks.prefetch(forward_after(0));
    ops.embedding_forward(a.x.data(), batch.inputs, emb(layout_.tok_embeddings), N, C);
    if (!layout_.tied()) blocks.release(0);  // tied: the head reads it again
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const int b = layout_.layer_block(l);
      const Weights P = acquire(blocks, b);
      blocks.prefetch(forward_after(b));
      layer_forward(ops, P, batch, l, /*with_output=*/true);
      blocks.release(b);
    }
    const Weights W = acquire(blocks, head);
    const Weights out = layout_.tied() ? emb : W;
    const Act* x_last = a.x.data() + size_t(cfg_.n_layers) * N * C;
    ops.rmsnorm_forward(a.xf.data(), a.rstdf.data(), x_last, W(layout_.norm), N, C, cfg_.norm_eps);
    ops.matmul_forward(a.logits.data(), a.xf.data(), out(layout_.output), N, C, V);
    blocks.release(head);
    if (layout_.tied()) blocks.release(0);
    if (!batch.targets) return 0.0;
    return ops.crossentropy_forward(a.losses.data(), a.lse_ce.data(), a.logits.data(), batch.targets,
                                    batch.loss_mask, N, V);
  }

  // Backward of (dloss * summed loss) after forward() on the same batch: += into G.
  void backward(Ops& ops, const Param* P, Grad* G, const Batch& batch, float dloss) {
    FlatBlocks flat(ops, layout_, P, G);
    backward(ops, flat, batch, dloss);
  }
  void backward(Ops& ops, ParamBlocks<Param, Grad>& blocks, const Batch& batch, float dloss) {
    const int B = batch.B, Tn = batch.T;
    Activations& a = acts_;
    LT_CHECK(a.B == B && a.Tn == Tn, "backward() without a matching forward()");
    LT_CHECK(batch.targets, "backward() needs targets");
    const int N = B * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
    const int H = cfg_.n_heads, KVH = cfg_.n_kv_heads, hd = cfg_.head_dim(), V = cfg_.vocab_size;

    Act* dlogits = a.logits.data();  // in place: (N,V)
    ops.crossentropy_backward(dlogits, a.logits.data(), a.lse_ce.data(), batch.targets, batch.loss_mask,
                              dloss, N, V);
    const int head = layout_.head_block();
    const Weights Ph = acquire(blocks, head);
    const Gradients Gh = grads(blocks, head);
    const Weights Pout = layout_.tied() ? acquire(blocks, 0) : Ph;  // tied: block 0 until the end
    const Gradients Gout = layout_.tied() ? grads(blocks, 0) : Gh;
    Act* dxf = a.dtmp.data();
    ops.matmul_backward(dxf, Gout(layout_.output), dlogits, a.xf.data(), Pout(layout_.output), N, C, V);
    if (cfg_.n_layers > 0) blocks.prefetch(layout_.layer_block(cfg_.n_layers - 1));
    Act* dx = a.dx.data();  // gradient of the residual stream, (N,C)
    const Act* x_last = a.x.data() + size_t(cfg_.n_layers) * N * C;
    ops.rmsnorm_backward(dx, Gh(layout_.norm), dxf, x_last, Ph(layout_.norm), a.rstdf.data(), N, C);
    blocks.release(head);
    blocks.grads_done(head);  // the final norm and the output head (untied) are done

    for (int l = cfg_.n_layers - 1; l >= 0; --l) {
      const int b = layout_.layer_block(l);
      const Weights P = acquire(blocks, b);
      if (l > 0) blocks.prefetch(layout_.layer_block(l - 1));
      const Gradients G = grads(blocks, b);
      // Refill what this mode did not keep for layer l (forward's ops on forward's inputs). full
      // also writes dtmp (wo's product), which holds nothing between layers.
      if (recompute_ == Recompute::kFull) layer_forward(ops, P, batch, l, /*with_output=*/false);
      if (recompute_ == Recompute::kAttn) attention_block_forward(ops, P, batch, l);

      const auto& W = layout_.layers[size_t(l)];
      const LayerActs s = layer_acts(l);
      Act* dhs = a.dhs.data();
      Act* dh1 = a.dh1.data();
      Act* dh3 = a.dh3.data();
      Act* dxn = a.dtmp.data();
      Act* dtmp = a.dtmp2.data();

      // x_next = x2 + w2(swiglu(w1 xn2, w3 xn2)): dx flows to x2 unchanged and into the FFN.
      linear_backward(ops, dhs, G(W.w2), dx, s.hs, P(W.w2), N, F, C, l, LoraTarget::kW2);
      ops.swiglu_backward(dh1, dh3, dhs, s.h1, s.h3, N, F);
      linear_backward(ops, dxn, G(W.w1), dh1, s.xn2, P(W.w1), N, C, F, l, LoraTarget::kW1);
      linear_backward(ops, dtmp, G(W.w3), dh3, s.xn2, P(W.w3), N, C, F, l, LoraTarget::kW3);
      ops.residual_add(dxn, dxn, dtmp, size_t(N) * C);
      ops.rmsnorm_backward(dtmp, G(W.ffn_norm), dxn, s.x2, P(W.ffn_norm), s.rstd2, N, C);
      ops.residual_add(dx, dx, dtmp, size_t(N) * C);  // dx is now d(x2)

      // x2 = x + wo(attention(rope(wq xn1), rope(wk xn1), wv xn1))
      Act* datt = a.datt.data();
      Act* dq = a.dq.data();
      Act* dk = a.dk.data();
      Act* dv = a.dv.data();
      linear_backward(ops, datt, G(W.wo), dx, s.att, P(W.wo), N, C, C, l, LoraTarget::kWo);
      ops.attention_backward(dq, dk, dv, datt, s.att, s.lse, s.q, s.k, s.v, batch.seg_start, B, Tn, H, KVH, hd);
      ops.rope_backward(dq, dq, batch.pos, B, Tn, H, hd, cfg_.rope_theta);
      ops.rope_backward(dk, dk, batch.pos, B, Tn, KVH, hd, cfg_.rope_theta);
      linear_backward(ops, dxn, G(W.wq), dq, s.xn1, P(W.wq), N, C, C, l, LoraTarget::kWq);
      linear_backward(ops, dtmp, G(W.wk), dk, s.xn1, P(W.wk), N, C, KV, l, LoraTarget::kWk);
      ops.residual_add(dxn, dxn, dtmp, size_t(N) * C);
      linear_backward(ops, dtmp, G(W.wv), dv, s.xn1, P(W.wv), N, C, KV, l, LoraTarget::kWv);
      ops.residual_add(dxn, dxn, dtmp, size_t(N) * C);
      ops.rmsnorm_backward(dtmp, G(W.attention_norm), dxn, s.x, P(W.attention_norm), s.rstd1, N, C);
      ops.residual_add(dx, dx, dtmp, size_t(N) * C);  // dx is now d(x), the layer input
      blocks.release(b);
      blocks.grads_done(b);
    }
    const Gradients Ge = grads(blocks, 0);  // the embedding's backward reads no weights
    if (Ge.p) ops.embedding_backward(Ge(layout_.tok_embeddings), dx, batch.inputs, N, V, C);
    if (layout_.tied()) blocks.release(0);
    blocks.grads_done(0);
  }

  // The last forward()'s logits (N,V) and per-token losses (N), in the backend's storage.
  // backward() overwrites the logits with their gradient.
  const Act* logits() const { return acts_.logits.data(); }
  const Stat* token_losses() const { return acts_.losses.data(); }

 private:
  // A block's storage as the pass addresses it: by flat offset, element 0 at the block's begin.
  template <class X>
  struct BlockPtr {
    X* p;
    size_t begin;
    X* operator()(size_t offset) const { return p ? p + (offset - begin) : nullptr; }
  };
  using Weights = BlockPtr<const Param>;
  using Gradients = BlockPtr<Grad>;
  // The block forward acquires after block b (not past the head).
  int forward_after(int b) const { return std::min(b + 1, layout_.head_block()); }
  Weights acquire(ParamBlocks<Param, Grad>& blocks, int b) const {
    return {blocks.acquire(b), layout_.blocks[size_t(b)].begin};
  }
  Gradients grads(ParamBlocks<Param, Grad>& blocks, int b) const {
    return {blocks.grads(b), layout_.blocks[size_t(b)].begin};
  }

  // The plain flat buffers P and G (G null for a forward): a block is its range of them, its
  // acquire tells the ops that its weights are about to be read (ops.weights_needed(b)), and its
  // grads_done that every gradient from the block's begin on is final.
  class FlatBlocks final : public ParamBlocks<Param, Grad> {
   public:
    FlatBlocks(Ops& ops, const ParameterLayout& layout, const Param* P, Grad* G)
        : ops_(ops), layout_(layout), P_(P), G_(G) {}
    const Param* acquire(int b) override {
      ops_.weights_needed(b);
      return P_ + begin(b);
    }
    void release(int) override {}
    Grad* grads(int b) override { return G_ ? G_ + begin(b) : nullptr; }  // null: a frozen base
    void grads_done(int b) override { ops_.grads_final_from(begin(b)); }

   private:
    size_t begin(int b) const { return layout_.blocks[size_t(b)].begin; }
    Ops& ops_;
    const ParameterLayout& layout_;
    const Param* P_;
    Grad* G_;
  };

  struct Activations {
    int B = 0, Tn = 0;
    Buffer<Act> x;  // (L+1, N, C) residual stream: input of each layer, final
    // Per layer, or one layer's worth when the mode recomputes them (see the header).
    Buffer<Act> xn1, q, k, v, att, x2, xn2, h1, h3, hs;
    Buffer<Stat> rstd1, lse, rstd2;
    Buffer<Act> xf;                                       // final norm (N,C)
    Buffer<Stat> rstdf;                                   // (N)
    Buffer<Act> logits;                                   // (N,V); dlogits in place during backward
    Buffer<Stat> losses, lse_ce;                          // (N)
    // backward scratch (dtmp is also forward's scratch for the wo and w2 products)
    Buffer<Act> dx, dtmp, dtmp2, datt, dq, dk, dv, dh1, dh3, dhs;
    // LoRA: u of every adapter (sites, N, r), kept; scratch for the dropped input (N, widest in),
    // the adapter's output or dx share (N, widest), and du (N, r).
    Buffer<Act> lora_u, lora_x, lora_y, lora_du;
  };

  // Layer l's activations: where forward writes them and backward reads them.
  struct LayerActs {
    Act* x;      // (N,C) layer input
    Act* xn1;    // (N,C)
    Stat* rstd1; // (N)
    Act* q;      // (B,Tn,H,hd)
    Act* k;      // (B,Tn,KVH,hd)
    Act* v;      // (B,Tn,KVH,hd)
    Act* att;    // (B,Tn,H,hd)
    Stat* lse;   // (B,H,Tn)
    Act* x2;     // (N,C) after the attention residual
    Act* xn2;    // (N,C)
    Stat* rstd2; // (N)
    Act* h1;     // (N,F)
    Act* h3;     // (N,F)
    Act* hs;     // (N,F)
    Act* x_next; // (N,C) layer output, the next layer's input
  };

  bool keeps_attention() const { return recompute_ == Recompute::kNone; }
  bool keeps_layers() const { return recompute_ != Recompute::kFull; }

  LayerActs layer_acts(int l) {
    Activations& a = acts_;
    const size_t N = size_t(a.B) * a.Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
    const size_t BHT = size_t(a.B) * cfg_.n_heads * a.Tn;
    const size_t ll = keeps_layers() ? size_t(l) : 0;     // slot of the buffers attn keeps
    const size_t la = keeps_attention() ? size_t(l) : 0;  // slot of q, k, v, att, lse
    LayerActs s;
    s.x = a.x.data() + size_t(l) * N * C;
    s.x_next = s.x + N * C;
    s.xn1 = a.xn1.data() + ll * N * C;
    s.rstd1 = a.rstd1.data() + ll * N;
    s.q = a.q.data() + la * N * C;
    s.k = a.k.data() + la * N * KV;
    s.v = a.v.data() + la * N * KV;
    s.att = a.att.data() + la * N * C;
    s.lse = a.lse.data() + la * BHT;
    s.x2 = a.x2.data() + ll * N * C;
    s.xn2 = a.xn2.data() + ll * N * C;
    s.rstd2 = a.rstd2.data() + ll * N;
    s.h1 = a.h1.data() + ll * N * F;
    s.h3 = a.h3.data() + ll * N * F;
    s.hs = a.hs.data() + ll * N * F;
    return s;
  }

  // q, k, v, att and lse of layer l from its xn1: rope(wq xn1), rope(wk xn1), wv xn1, attention.
  void attention_block_forward(Ops& ops, const Weights& P, const Batch& batch, int l) {
    const auto& W = layout_.layers[size_t(l)];
    const LayerActs s = layer_acts(l);
    const int B = batch.B, Tn = batch.T, N = B * Tn, C = cfg_.dim, KV = cfg_.kv_dim();
    const int H = cfg_.n_heads, KVH = cfg_.n_kv_heads, hd = cfg_.head_dim();
    linear_forward(ops, s.q, s.xn1, P(W.wq), N, C, C, l, LoraTarget::kWq);
    linear_forward(ops, s.k, s.xn1, P(W.wk), N, C, KV, l, LoraTarget::kWk);
    linear_forward(ops, s.v, s.xn1, P(W.wv), N, C, KV, l, LoraTarget::kWv);
    ops.rope_forward(s.q, s.q, batch.pos, B, Tn, H, hd, cfg_.rope_theta);
    ops.rope_forward(s.k, s.k, batch.pos, B, Tn, KVH, hd, cfg_.rope_theta);
    ops.attention_forward(s.att, s.lse, s.q, s.k, s.v, batch.seg_start, B, Tn, H, KVH, hd);
  }

  // Layer l's forward from its input x[l]. with_output: also w2's product and the residual add
  // into x[l+1]; backward's recomputation skips them (x[l+1] is kept, and no backward op reads
  // the w2 product).
  void layer_forward(Ops& ops, const Weights& P, const Batch& batch, int l, bool with_output) {
    const auto& W = layout_.layers[size_t(l)];
    const LayerActs s = layer_acts(l);
    Act* tmp = acts_.dtmp.data();  // (N,C) the wo and w2 products
    const int N = batch.B * batch.T, C = cfg_.dim, F = cfg_.hidden_dim;
    ops.rmsnorm_forward(s.xn1, s.rstd1, s.x, P(W.attention_norm), N, C, cfg_.norm_eps);
    attention_block_forward(ops, P, batch, l);
    linear_forward(ops, tmp, s.att, P(W.wo), N, C, C, l, LoraTarget::kWo);
    ops.residual_add(s.x2, s.x, tmp, size_t(N) * C);
    ops.rmsnorm_forward(s.xn2, s.rstd2, s.x2, P(W.ffn_norm), N, C, cfg_.norm_eps);
    linear_forward(ops, s.h1, s.xn2, P(W.w1), N, C, F, l, LoraTarget::kW1);
    linear_forward(ops, s.h3, s.xn2, P(W.w3), N, C, F, l, LoraTarget::kW3);
    ops.swiglu_forward(s.hs, s.h1, s.h3, N, F);
    if (!with_output) return;
    linear_forward(ops, tmp, s.hs, P(W.w2), N, F, C, l, LoraTarget::kW2);
    ops.residual_add(s.x_next, s.x2, tmp, size_t(N) * C);
  }

  // out = x W^T (N, IC) -> (N, OC), plus the adapter on (l, t) where there is one.
  void linear_forward(Ops& ops, Act* out, const Act* x, const Param* w, int N, int IC, int OC, int l, LoraTarget t) {
    ops.matmul_forward(out, x, w, N, IC, OC);
    if constexpr (Ops::kLora)
      if (const LoraSite* site = lora_site(l, t)) lora_forward(ops, *site, out, x, N);
  }
  // dx = dout W, dW += dout^T x (none where dw is null: a frozen base), then the adapter's share.
  void linear_backward(Ops& ops, Act* dx, Grad* dw, const Act* dout, const Act* x, const Param* w, int N, int IC,
                       int OC, int l, LoraTarget t) {
    ops.matmul_backward(dx, dw, dout, x, w, N, IC, OC);
    if constexpr (Ops::kLora)
      if (const LoraSite* site = lora_site(l, t)) lora_backward(ops, *site, dx, dout, x, N);
  }
  const LoraSite* lora_site(int l, LoraTarget t) const { return lora_layout_ ? lora_layout_->find(l, t) : nullptr; }
  size_t lora_index(const LoraSite& s) const { return size_t(&s - lora_layout_->sites().data()); }
  float lora_dropout() const { return lora_stream_ ? lora_layout_->config().dropout : 0.f; }
  // Site s's dropout stream: the pass's stream and the site's place in the layout, mixed by the op.
  uint64_t lora_site_stream(const LoraSite& s) const { return lora_stream_ * 0x9E3779B97F4A7C15ull + lora_index(s) + 1; }
  // x itself, or dropout(x) in scratch.
  const Act* lora_input(Ops& ops, const LoraSite& s, const Act* x, int N) {
    if (lora_dropout() <= 0) return x;
    ops.dropout(acts_.lora_x.data(), x, size_t(N) * s.in, lora_dropout(), lora_site_stream(s));
    return acts_.lora_x.data();
  }
  Act* lora_u(const LoraSite& s, int N) {
    return acts_.lora_u.data() + lora_index(s) * size_t(N) * lora_layout_->config().rank;
  }
  // out += B u with u = s * A dropout(x), kept for backward.
  void lora_forward(Ops& ops, const LoraSite& s, Act* out, const Act* x, int N) {
    const int r = lora_layout_->config().rank;
    Act* u = lora_u(s, N);
    Act* y = acts_.lora_y.data();
    ops.matmul_forward(u, lora_input(ops, s, x, N), lora_W_ + s.a, N, s.in, r);
    ops.scale(u, lora_layout_->config().scale(), size_t(N) * r);
    ops.matmul_forward(y, u, lora_W_ + s.b, N, r, s.out);
    ops.residual_add(out, out, y, size_t(N) * s.out);
  }
  // dB += dout^T u; du = s * dout B; dA += du^T dropout(x); dx += dropout'(du A).
  void lora_backward(Ops& ops, const LoraSite& s, Act* dx, const Act* dout, const Act* x, int N) {
    const int r = lora_layout_->config().rank;
    Act* du = acts_.lora_du.data();
    Act* dxs = acts_.lora_y.data();
    LT_CHECK(lora_G_, "LoRA backward without adapter gradients");
    ops.matmul_backward(du, lora_G_ + s.b, dout, lora_u(s, N), lora_W_ + s.b, N, r, s.out);
    ops.scale(du, lora_layout_->config().scale(), size_t(N) * r);
    ops.matmul_backward(dxs, lora_G_ + s.a, du, lora_input(ops, s, x, N), lora_W_ + s.a, N, s.in, r);
    if (lora_dropout() > 0) ops.dropout(dxs, dxs, size_t(N) * s.in, lora_dropout(), lora_site_stream(s));
    ops.residual_add(dx, dx, dxs, size_t(N) * s.in);
  }

  // Calls fn(buffer, elements) for every buffer of `a` at batch shape (B, Tn) in the current mode.
  template <class Fn>
  void for_each_buffer(Activations& a, int B, int Tn, Fn&& fn) const {
    const size_t N = size_t(B) * Tn, C = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim();
    const size_t L = cfg_.n_layers, V = cfg_.vocab_size, H = cfg_.n_heads;
    const size_t Ll = keeps_layers() ? L : 1;     // layers of xn1, x2, xn2, h1, h3, hs, rstd1, rstd2
    const size_t La = keeps_attention() ? L : 1;  // layers of q, k, v, att, lse
    fn(a.x, (L + 1) * N * C);
    fn(a.xn1, Ll * N * C);
    fn(a.rstd1, Ll * N);
    fn(a.q, La * N * C);
    fn(a.k, La * N * KV);
    fn(a.v, La * N * KV);
    fn(a.att, La * N * C);
    fn(a.lse, La * B * H * Tn);
    fn(a.x2, Ll * N * C);
    fn(a.xn2, Ll * N * C);
    fn(a.rstd2, Ll * N);
    fn(a.h1, Ll * N * F);
    fn(a.h3, Ll * N * F);
    fn(a.hs, Ll * N * F);
    fn(a.xf, N * C);
    fn(a.rstdf, N);
    fn(a.logits, N * V);
    fn(a.losses, N);
    fn(a.lse_ce, N);
    fn(a.dx, N * C);
    fn(a.dtmp, N * C);
    fn(a.dtmp2, N * C);
    fn(a.datt, N * C);
    fn(a.dq, N * C);
    fn(a.dk, N * KV);
    fn(a.dv, N * KV);
    fn(a.dh1, N * F);
    fn(a.dh3, N * F);
    fn(a.dhs, N * F);
    const LoraLayout* lo = lora_layout_;
    const size_t r = lo ? size_t(lo->config().rank) : 0, sites = lo ? lo->sites().size() : 0;
    const bool dropout = lo && lo->config().dropout > 0;
    fn(a.lora_u, sites * N * r);
    fn(a.lora_x, dropout ? N * std::max(C, F) : 0);
    fn(a.lora_y, sites ? N * std::max(C, F) : 0);
    fn(a.lora_du, sites ? N * r : 0);
  }

  void ensure_activations(int B, int Tn) {
    Activations& a = acts_;
    if (a.B == B && a.Tn == Tn) return;
    a = Activations();  // frees the old buffers before the new ones are allocated
    a.B = B;
    a.Tn = Tn;
    for_each_buffer(a, B, Tn, [](auto& buf, size_t n) { buf.resize(n); });
  }

  Llama2Config cfg_;
  ParameterLayout layout_;
  Recompute recompute_ = Recompute::kNone;
  Activations acts_;
  const LoraLayout* lora_layout_ = nullptr;  // set_lora
  const Param* lora_W_ = nullptr;
  Grad* lora_G_ = nullptr;
  uint64_t lora_stream_ = 0;
};

}  // namespace lt
