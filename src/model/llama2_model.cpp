// Llama 2 on the CPU backend: the parameter/gradient storage of Llama2ModelT and the CPU op
// policy that runs the shared forward/backward pass (llama2_pass.h) over ops_cpu.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <type_traits>
#include <vector>

#include "backend/cpu/aligned_allocator.h"
#include "backend/cpu/onednn/attention_onednn.h"
#include "backend/cpu/onednn/bf16_matmuls.h"
#include "backend/cpu/onednn/ops_bf16.h"

#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/rng.h"
#include "model/llama2_pass.h"

namespace lt {
namespace cpu {

// The CPU op policy of Llama2Pass: every storage type is T, buffers are std::vector, and the ops
// are ops_cpu.h (a null loss mask means every token carries loss).
// With bf16 set (--precision bf16, T = float) the matrix products read bf16 copies of their operands
// (Bf16Matmuls), the element-wise ops and attention run on AVX-512 (ops_bf16.h, attention_onednn.h;
// the bf16 path exists only on AVX-512 CPUs): RMSNorm and SwiGLU forward write the copy of their output in the same loop, SwiGLU
// backward and the cross-entropy backward write only the bf16 gradient (dh1, dh3 and dlogits feed
// only products; their fp32 buffers are left stale), and every other op that writes a buffer
// tells bf16 so (wrote) before a product could read an old copy.
// With times set, each op's seconds are added to its family.
template <class T>
struct PassOps {
  using Act = T;
  using Param = T;
  using Grad = T;
  using Stat = T;
  template <class U>
  using Buffer = AlignedVector<U>;  // cache-line aligned rows for the products (aligned_allocator.h)
  static constexpr bool kF32 = std::is_same_v<T, float>;
  static constexpr bool kLora = true;  // LoRA adapters (llama2_pass.h): fp32 or double only

  Bf16Matmuls* bf16 = nullptr;
  OpTimes* times = nullptr;
  // LoRA's adapters ([adapters, adapters_end): their weights): with bf16 set, their low-rank
  // products stay fp32 (fp32 masters, a fraction of a percent of the products' work, and PEFT
  // computes them in the adapters' dtype), and the SwiGLU backward writes its fp32 gradients too,
  // which the w1 and w3 adapters' backward reads.
  const T* adapters = nullptr;
  const T* adapters_end = nullptr;
  bool bf16_product(const T* w) const { return bf16 && !(w >= adapters && w < adapters_end); }

  // The CPU backend reduces gradients after the backward pass (ZeroOptimizer).
  void grads_final_from(size_t) {}
  // and its weights are always in place.
  void weights_needed(int) {}

  void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) {
    timed(&OpTimes::elementwise, [&] { cpu::embedding_forward(out, tokens, wte, N, C); });
    wrote(out);
  }
  void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int V, int C) {
    timed(&OpTimes::elementwise, [&] { cpu::embedding_backward(dwte, dout, tokens, N, V, C); });
  }
  void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, float eps) {
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16) return cpu::rmsnorm_forward_bf16(out, bf16->produce(out, size_t(N) * C), rstd, x, w, N, C, eps);
      cpu::rmsnorm_forward(out, rstd, x, w, N, C, eps);
    });
  }
  void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int N, int C) {
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16 && dw) return cpu::rmsnorm_backward_avx512(dx, dw, dout, x, w, rstd, N, C);  // dw null: frozen
      cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    });
    wrote(dx);
  }
  void matmul_forward(T* out, const T* x, const T* w, int N, int IC, int OC) {
    timed(&OpTimes::products, [&] {
      if constexpr (kF32)
        if (bf16_product(w)) return bf16->matmul_forward(out, x, w, N, IC, OC);
      cpu::matmul_forward(out, x, w, N, IC, OC);
      wrote(out);  // an fp32 product (an adapter's): any bf16 copy of out is stale
    });
  }
  void matmul_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, int N, int IC, int OC) {
    timed(&OpTimes::products, [&] {
      if constexpr (kF32)
        if (bf16_product(w)) return bf16->matmul_backward(dx, dw, dout, x, w, N, IC, OC);
      cpu::matmul_backward(dx, dw, dout, x, w, N, IC, OC);
      if (dx) wrote(dx);
    });
  }
  void rope_forward(T* out, const T* x, const int32_t* pos, int B, int Tn, int H, int hd, float theta) {
    timed(&OpTimes::attention, [&] {
      if constexpr (kF32)
        if (bf16) return cpu::rope_forward_avx512(out, x, pos, B, Tn, H, hd, theta);
      cpu::rope_forward(out, x, pos, B, Tn, H, hd, theta);
    });
    wrote(out);
  }
  void rope_backward(T* dx, const T* dout, const int32_t* pos, int B, int Tn, int H, int hd, float theta) {
    timed(&OpTimes::attention, [&] {
      if constexpr (kF32)
        if (bf16) return cpu::rope_backward_avx512(dx, dout, pos, B, Tn, H, hd, theta);
      cpu::rope_backward(dx, dout, pos, B, Tn, H, hd, theta);
    });
    wrote(dx);
  }
  void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* seg_start, int B,
                         int Tn, int H, int KVH, int hd) {
    timed(&OpTimes::attention, [&] {
      if constexpr (kF32)
        if (bf16) return cpu::attention_forward_onednn(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
      cpu::attention_forward(out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
    });
    wrote(out);
  }
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                          const T* k, const T* v, const int32_t* seg_start, int B, int Tn, int H, int KVH,
                          int hd) {
    timed(&OpTimes::attention, [&] {
      if constexpr (kF32)
        if (bf16)
          return cpu::attention_backward_onednn(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
      cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, seg_start, B, Tn, H, KVH, hd);
    });
    wrote(dq), wrote(dk), wrote(dv);
  }
  void swiglu_forward(T* out, const T* h1, const T* h3, int N, int F) {
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16) return cpu::swiglu_forward_bf16(out, bf16->produce(out, size_t(N) * F), h1, h3, N, F);
      cpu::swiglu_forward(out, h1, h3, N, F);
    });
  }
  void swiglu_backward(T* dh1, T* dh3, const T* dout, const T* h1, const T* h3, int N, int F) {
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16 && !adapters)
          return cpu::swiglu_backward_bf16(bf16->produce(dh1, size_t(N) * F), bf16->produce(dh3, size_t(N) * F),
                                           dout, h1, h3, N, F);
      cpu::swiglu_backward(dh1, dh3, dout, h1, h3, N, F);
      wrote(dh1), wrote(dh3);  // the fp32 gradients (LoRA's w1, w3 read them): any bf16 copy is stale
    });
  }
  void residual_add(T* out, const T* a, const T* b, size_t n) {
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16) return cpu::residual_add_avx512(out, a, b, n);
      cpu::residual_add(out, a, b, n);
    });
    wrote(out);
  }
  void scale(T* x, float s, size_t n) {
    timed(&OpTimes::elementwise, [&] { cpu::scale(x, s, n); });
    wrote(x);
  }
  void dropout(T* out, const T* x, size_t n, float p, uint64_t stream) {
    timed(&OpTimes::elementwise, [&] { cpu::dropout(out, x, n, p, stream); });
    wrote(out);
  }
  double crossentropy_forward(T* losses, T* lse, const T* logits, const int32_t* targets, const uint8_t* mask,
                              int N, int V) {
    double sum = 0;
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16) {
          float* row_max = bf16->ce_row_max(size_t(N));
          float* target_logit = bf16->ce_target_logit(size_t(N));
          const bool in_bf16 = bf16->logits_in_bf16(logits);  // the head product wrote them in bf16 only
          lt::cpu::bf16* e = bf16->ce_exp(logits, size_t(N) * V);
          sum = in_bf16 ? cpu::crossentropy_forward_from_bf16(losses, lse, e, row_max, target_logit, targets,
                                                              mask_or_ones(mask, N), N, V)
                        : cpu::crossentropy_forward_bf16(losses, lse, e, row_max, target_logit, logits, targets,
                                                         mask_or_ones(mask, N), N, V);
          return;
        }
      sum = cpu::crossentropy_forward(losses, lse, logits, targets, mask_or_ones(mask, N), N, V);
    });
    return sum;
  }
  void crossentropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                             const uint8_t* mask, float dloss, int N, int V) {
    timed(&OpTimes::elementwise, [&] {
      if constexpr (kF32)
        if (bf16) {
          // From the forward's exp rows when it kept them (training), else computed again.
          const bool kept = bf16->ce_kept(logits) && dlogits == logits;
          const float* row_max = kept ? bf16->ce_row_max(size_t(N)) : nullptr;
          LT_CHECK(kept || !bf16->logits_in_bf16(logits), "bf16 cross-entropy backward without its forward's exp");
          lt::cpu::bf16* d = bf16->produce(dlogits, size_t(N) * V);
          if (kept)
            return cpu::crossentropy_backward_from_exp_bf16(d, bf16->ce_target_logit(size_t(N)), lse, row_max, targets,
                                                            mask_or_ones(mask, N), dloss, N, V);
          return cpu::crossentropy_backward_bf16(d, logits, lse, targets, mask_or_ones(mask, N), dloss, N, V);
        }
      cpu::crossentropy_backward(dlogits, logits, lse, targets, mask_or_ones(mask, N), dloss, N, V);
    });
  }

 private:
  template <class F>
  void timed(double OpTimes::*family, F&& f) {
    if (!times) return f();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    times->*family += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void wrote(const T* p) {
    if constexpr (kF32)
      if (bf16) bf16->wrote(p);
  }
  const uint8_t* mask_or_ones(const uint8_t* mask, int N) {
    if (mask) return mask;
    ones_.assign(size_t(N), 1);
    return ones_.data();
  }
  std::vector<uint8_t> ones_;
};

}  // namespace cpu

template <class T>
Llama2ModelT<T>::Llama2ModelT(const Llama2Config& cfg, bool allocate_params)
    : cfg_(cfg), layout_(cfg), pass_(std::make_unique<Llama2Pass<cpu::PassOps<T>>>(cfg_, layout_)) {
  if (allocate_params) params_.assign(layout_.total(), T(0));
}

template <class T>
Llama2ModelT<T>::~Llama2ModelT() = default;
template <class T>
Llama2ModelT<T>::Llama2ModelT(Llama2ModelT&&) noexcept = default;
template <class T>
Llama2ModelT<T>& Llama2ModelT<T>::operator=(Llama2ModelT&&) noexcept = default;

template <class T>
void Llama2ModelT<T>::allocate_grads() { grads_.assign(layout_.total(), T(0)); }

template <class T>
void Llama2ModelT<T>::clear_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
  std::fill(lora_grads_.begin(), lora_grads_.end(), T(0));
}

template <class T>
void Llama2ModelT<T>::init_random(uint64_t seed) {
  init_random_range(cfg_, layout_, seed, 0, layout_.total(), params_.data());
}

template <class T>
void Llama2ModelT<T>::init_random_range(const Llama2Config& cfg, const ParameterLayout& layout, uint64_t seed,
                                        size_t begin, size_t end, T* out) {
  // One Rng stream over the weight-decayed tensors in layout order, two draws per value. splitmix64
  // advances its state by a constant per draw, so the stream is cut into chunks that threads (and
  // ranks holding a shard) start at their own offset: the values are those of the sequential
  // loop, and a 7B model initialises in seconds instead of minutes (the GPU check's training
  // benchmark).
  const uint64_t state0 = Rng(seed).state();
  constexpr uint64_t kStep = 0x9E3779B97F4A7C15ull;  // Rng::next_u64's increment
  const double std_base = 0.02;
  const double std_resid = 0.02 / std::sqrt(2.0 * cfg.n_layers);
  uint64_t drawn = 0;  // values drawn before this tensor
  for (const auto& t : layout.tensors()) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    T* p = lo < hi ? out + (lo - begin) : nullptr;  // this tensor's part of the range
    if (!t.weight_decay) {  // norm weights
      if (p) std::fill(p, p + (hi - lo), T(1));
      continue;
    }
    const bool resid = t.name.find("attention.wo") != std::string::npos ||
                       t.name.find("feed_forward.w2") != std::string::npos;
    const double sd = resid ? std_resid : std_base;
    constexpr int64_t kChunk = 1 << 16;
    const int64_t n = lo < hi ? int64_t(hi - lo) : 0, chunks = (n + kChunk - 1) / kChunk;
    const uint64_t first = drawn + (lo - t.offset);  // stream position of p[0]
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      Rng rng(state0 + 2 * (first + uint64_t(c * kChunk)) * kStep);
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) p[i] = T(sd * rng.normal());
    }
    drawn += t.numel;
  }
}

template <class T>
void Llama2ModelT<T>::set_recompute(Recompute r) { pass_->set_recompute(r); }

template <class T>
Recompute Llama2ModelT<T>::recompute() const { return pass_->recompute(); }

template <class T>
size_t Llama2ModelT<T>::activation_bytes(int B, int Tn) const {
  return pass_->activation_bytes(B, Tn);
}

void check_batch_ids(const Batch& batch, int V) {
  const int N = batch.B * batch.T;
  for (int i = 0; i < N; ++i)
    if (batch.inputs[i] < 0 || batch.inputs[i] >= V)
      fail(strcat("token id ", batch.inputs[i], " at position ", i, " is outside the model's vocab_size ", V));
  if (!batch.targets) return;
  for (int i = 0; i < N; ++i)
    if ((!batch.loss_mask || batch.loss_mask[i]) && (batch.targets[i] < 0 || batch.targets[i] >= V))
      fail(strcat("target id ", batch.targets[i], " at position ", i, " is outside the model's vocab_size ", V));
}

template <class T>
void Llama2ModelT<T>::check_batch(const Batch& batch) const {
  LT_CHECK(batch.B > 0 && batch.T > 0, "empty batch");
  LT_CHECK(batch.T <= cfg_.max_seq_len, "sequence length ", batch.T, " exceeds the model's max_seq_len ",
           cfg_.max_seq_len);
  check_batch_ids(batch, cfg_.vocab_size);
}

namespace {

// ZeRO stage 3 with bf16 products: the blocks' weights arrive in gathered buffers that are reused
// for other blocks, so each acquire tells Bf16Matmuls where they are now (block_weights), and
// where the output head is when the block holds it, and each release that its copies can go
// (forget). Everything else goes to the sharded blocks.
class Bf16GatheredBlocks final : public ParamBlocks<float, float> {
 public:
  Bf16GatheredBlocks(ParamBlocks<float, float>& inner, const ParameterLayout& layout, cpu::Bf16Matmuls& bf16)
      : inner_(inner), layout_(layout), bf16_(bf16) {}
  const float* acquire(int b) override {
    const float* p = inner_.acquire(b);
    const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
    const bool head = layout_.output >= blk.begin && layout_.output < blk.end;
    bf16_.block_weights(p, blk.size(), head ? p + (layout_.output - blk.begin) : nullptr);
    held_[b] = p;
    return p;
  }
  void release(int b) override {
    const auto it = held_.find(b);
    if (it != held_.end()) bf16_.forget(it->second, layout_.blocks[size_t(b)].size()), held_.erase(it);
    inner_.release(b);
  }
  float* grads(int b) override { return inner_.grads(b); }
  void grads_done(int b) override { inner_.grads_done(b); }
  void prefetch(int b) override { inner_.prefetch(b); }

 private:
  ParamBlocks<float, float>& inner_;
  const ParameterLayout& layout_;
  cpu::Bf16Matmuls& bf16_;
  std::map<int, const float*> held_;  // where each acquired block's weights are
};

}  // namespace

// The op policy of a forward pass (the bf16 weights' copy brought up to date first; at ZeRO stage
// 3, where params_ is empty, the blocks' gathered weights are copied as they are acquired).
template <class T>
cpu::PassOps<T> Llama2ModelT<T>::pass_ops(const Batch& batch) {
  cpu::PassOps<T> ops;
  ops.times = op_times_;
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {
      const bool whole = params_.size() >= layout_.total();
      bf16_->begin_forward(whole ? params_.data() : nullptr, whole ? params_.size() : 0, params_version_, batch.B,
                           batch.T, whole ? params_.data() + layout_.output : nullptr,
                           /*bf16_logits=*/batch.targets != nullptr);
      ops.bf16 = bf16_.get();
    }
  return ops;
}

// The blocks the pass reads: blocks itself, or with bf16 products over gathered weights (no whole
// weights here: ZeRO stage 3) that wrapper, held in *wrapper.
template <class T>
ParamBlocks<T, T>& Llama2ModelT<T>::pass_blocks(ParamBlocks<T, T>& blocks,
                                                std::unique_ptr<ParamBlocks<T, T>>* wrapper) {
  if constexpr (std::is_same_v<T, float>)
    if (bf16_ && params_.size() < layout_.total()) {
      *wrapper = std::make_unique<Bf16GatheredBlocks>(blocks, layout_, *bf16_);
      return **wrapper;
    }
  return blocks;
}

template <class T>
void Llama2ModelT<T>::enable_lora(const LoraConfig& cfg, uint64_t seed) {
  lora_ = std::make_unique<LoraLayout>(cfg_, cfg);
  lora_params_.assign(lora_->total(), T(0));
  lora_grads_.assign(lora_->total(), T(0));
  lora_->init(seed, lora_params_.data());
  grads_.clear();
  grads_.shrink_to_fit();
}

template <class T>
void Llama2ModelT<T>::bind_lora(cpu::PassOps<T>& ops) {
  if (!lora_) return;
  pass_->set_lora(lora_.get(), lora_params_.data(), lora_grads_.data(), lora_stream_);
  ops.adapters = lora_params_.data();
  ops.adapters_end = lora_params_.data() + lora_params_.size();
}

template <class T>
double Llama2ModelT<T>::forward(const Batch& batch, T* token_losses) {
  check_batch(batch);
  cpu::PassOps<T> ops = pass_ops(batch);
  bind_lora(ops);
  const double loss_sum = pass_->forward(ops, params_.data(), batch);
  if (token_losses && batch.targets)
    std::copy(pass_->token_losses(), pass_->token_losses() + size_t(batch.B) * batch.T, token_losses);
  return loss_sum;
}

template <class T>
double Llama2ModelT<T>::forward(const Batch& batch, ParamBlocks<T, T>& blocks, T* token_losses) {
  check_batch(batch);
  cpu::PassOps<T> ops = pass_ops(batch);
  bind_lora(ops);
  std::unique_ptr<ParamBlocks<T, T>> wrapper;
  const double loss_sum = pass_->forward(ops, pass_blocks(blocks, &wrapper), batch);
  if (token_losses && batch.targets)
    std::copy(pass_->token_losses(), pass_->token_losses() + size_t(batch.B) * batch.T, token_losses);
  return loss_sum;
}

template <class T>
void Llama2ModelT<T>::backward(const Batch& batch, float dloss) {
  LT_CHECK(lora_ || !grads_.empty(), "backward() before allocate_grads()");
  cpu::PassOps<T> ops;
  ops.times = op_times_;
  ops.bf16 = bf16_.get();
  bind_lora(ops);
  pass_->backward(ops, params_.data(), lora_ ? nullptr : grads_.data(), batch, dloss);
}

template <class T>
void Llama2ModelT<T>::backward(const Batch& batch, float dloss, ParamBlocks<T, T>& blocks) {
  cpu::PassOps<T> ops;
  ops.times = op_times_;
  ops.bf16 = bf16_.get();
  bind_lora(ops);
  std::unique_ptr<ParamBlocks<T, T>> wrapper;
  pass_->backward(ops, pass_blocks(blocks, &wrapper), batch, dloss);
}

template <class T>
const T* Llama2ModelT<T>::logits() const { return pass_->logits(); }

template <class T>
void Llama2ModelT<T>::set_precision(Precision p) {
  if (p == precision_) return;
  if (p == Precision::kFp32) {
    bf16_.reset();
  } else {
    LT_CHECK((std::is_same_v<T, float>), "--precision bf16 needs the fp32 model");
    bf16_ = std::make_unique<cpu::Bf16Matmuls>();
  }
  precision_ = p;
}

template <class T>
size_t Llama2ModelT<T>::bf16_copy_peak_bytes() const {
  return bf16_ ? bf16_->peak_bytes() : 0;
}

template class Llama2ModelT<float>;
template class Llama2ModelT<double>;

}  // namespace lt
