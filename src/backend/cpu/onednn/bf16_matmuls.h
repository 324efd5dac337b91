// The matrix products of the CPU backend's bf16 path (--precision bf16): bf16 operands, fp32
// accumulation and output (oneDNN, matmul_onednn.h), for the model pass's op policy
// (src/model/llama2_model.cpp). Activations, gradients, statistics and weights stay fp32 in the
// pass; this object keeps the bf16 copies the products read:
//   weights   one bf16 copy of the whole fp32 parameter vector, made again only when the
//             parameters changed (a new version: once per optimizer step); at ZeRO stage 3 no
//             rank holds the whole vector: a block's weights arrive in a gathered buffer that is
//             reused for other blocks, and are then copied like the operands below, once per
//             gather (block_weights() drops the buffer's old copies, forget() those of a
//             released buffer, so at most the held blocks have copies)
//   operands  a bf16 copy per fp32 activation buffer the products read, keyed by its address:
//             written by the op that produces the buffer in the same loop (ops_bf16.h, produce()),
//             or converted once on first use by a product and reused by the next ones (xn1 feeds
//             wq, wk, wv and their weight gradients). An op that writes a buffer without its copy
//             calls wrote(), so a product never reads a stale copy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/cpu/aligned_allocator.h"
#include "backend/cpu/onednn/bf16.h"

namespace lt::cpu {

class Bf16Matmuls {
 public:
  // Throws lt::Error when oneDNN cannot be loaded (what to install) or this build has no oneDNN.
  Bf16Matmuls();

  // Before a forward pass over the parameters params (n floats) at `version`: the weights' copy
  // is made again when the version or the address changed; the operand copies are all dropped
  // when the batch shape changed (the pass reallocated its buffers). With bf16_logits, the product
  // with the output head head_w writes the logits in bf16 only (into the storage ce_exp() returns
  // for them), as PyTorch's bf16 autocast does: the forward's largest output at half the bytes;
  // the cross-entropy then reads them there (logits_in_bf16) and the fp32 logits are not written.
  // params may be null (n 0): no whole weights (ZeRO stage 3); then block_weights() says where
  // each block's are, and head_w is given there.
  void begin_forward(const float* params, size_t n, uint64_t version, int B, int Tn, const float* head_w = nullptr,
                     bool bf16_logits = false);
  // A block's weights were just written at p (n floats: a gathered buffer): every copy made from
  // that range is stale. head_w, when not null, is the output head's weights inside it.
  void block_weights(const float* p, size_t n, const float* head_w);
  // The buffer at p (n floats) is released: its copies are dropped (the next buffers are elsewhere).
  void forget(const float* p, size_t n);
  // The bf16 copy of the fp32 buffer p (n elements), marked current: the caller writes it now.
  bf16* produce(const float* p, size_t n);
  // p's fp32 contents changed without its copy.
  void wrote(const float* p);

  // The cross-entropy's forward keeps exp(logits - row max) (N*V bf16, in the storage of the
  // logits' copy, not current as a copy) and the row maxima (N) for its backward, which turns them
  // into dlogits in place (produce() on the same address): one exp pass over the logits, not two.
  bf16* ce_exp(const float* logits, size_t n);
  float* ce_row_max(size_t N);
  // Whether the last forward's cross-entropy kept them for these logits (cleared by begin_forward).
  bool ce_kept(const float* logits) const { return ce_logits_ == logits && logits != nullptr; }
  // Whether these logits exist only in bf16, in ce_exp()'s storage (begin_forward's bf16_logits).
  bool logits_in_bf16(const float* logits) const { return bf16_logits_at_ == logits && logits != nullptr; }
  // The target's logit per row (N), fp32, kept by the cross-entropy's forward for its backward.
  float* ce_target_logit(size_t N);

  // The most bytes of bf16 copies (weights and operands) and cross-entropy rows held at once so
  // far: what --precision bf16 adds to the fp32 path's memory (zero.h's bf16_copy_bytes predicts it).
  size_t peak_bytes() const { return peak_bytes_; }

  // out (N,OC) = x (N,IC) @ w^T, w (OC,IC): ops_cpu.h's matmul_forward with bf16 operands.
  void matmul_forward(float* out, const float* x, const float* w, int N, int IC, int OC);
  // dx (N,IC) = dout @ w (skipped when dx is null); dw (OC,IC) += dout^T @ x (skipped when dw is null).
  void matmul_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int N, int IC,
                       int OC);

 private:
  struct Copy {
    AlignedVector<bf16> data;
    bool current = false;
  };
  // The bf16 copy of a weight (inside the parameters) or of an activation buffer (n elements).
  const bf16* operand(const float* p, size_t n);
  // The copy c holds at least n elements (peak_bytes() updated when it grew).
  void reserve(Copy& c, size_t n);
  void held_changed();

  std::unordered_map<const float*, Copy> copies_;
  const float* params_ = nullptr;
  size_t n_params_ = 0;
  uint64_t version_ = ~uint64_t(0);
  AlignedVector<bf16> weights_;  // (n_params)
  int B_ = 0, Tn_ = 0;
  const float* ce_logits_ = nullptr;
  std::vector<float> ce_row_max_, ce_target_logit_;
  const float* head_w_ = nullptr;         // the output head's weights, when its logits go to bf16
  bool bf16_logits_ = false;              // whether they do (begin_forward)
  const float* bf16_logits_at_ = nullptr;  // the fp32 logits buffer whose values are in bf16 only
  size_t peak_bytes_ = 0;
};

}  // namespace lt::cpu
