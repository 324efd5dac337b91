// The Llama 2 model: a size table of named tensors over ONE flat parameter buffer, and the
// forward/backward orchestration written once over the op set (src/model/llama2_pass.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llamatrain/batch.h"
#include "llamatrain/config.h"
#include "llamatrain/lora.h"
#include "llamatrain/param_blocks.h"

namespace lt {

struct TensorInfo {
  std::string name;             // Meta naming, e.g. "layers.3.attention.wq.weight"
  std::vector<int64_t> shape;   // PyTorch (out_features, in_features) order for matrices
  size_t offset = 0;            // into the flat buffer (floats)
  size_t numel = 0;
  bool weight_decay = true;     // false for norm weights
};

// A flat buffer's named tensors, as checkpoints and the optimizer see them: a model's
// (ParameterLayout) or LoRA's adapters (LoraLayout::table).
class TensorTable {
 public:
  TensorTable() = default;
  TensorTable(std::vector<TensorInfo> tensors, size_t total) : tensors_(std::move(tensors)), total_(total) {}
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t total() const { return total_; }

 protected:
  std::vector<TensorInfo> tensors_;
  size_t total_ = 0;
};

// Order: tok_embeddings, then per layer (attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3),
// then norm, output (absent when tied: the head reads tok_embeddings). Layer-contiguous so that
// per-layer gradient buckets are contiguous ranges.
class ParameterLayout : public TensorTable {
 public:
  struct Layer {
    size_t attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3;
  };
  explicit ParameterLayout(const Llama2Config& cfg);
  const TensorInfo& find(const std::string& name) const;  // throws lt::Error if absent
  const TensorInfo* try_find(const std::string& name) const;

  size_t tok_embeddings = 0;
  size_t norm = 0;
  size_t output = 0;  // == tok_embeddings when tied
  std::vector<Layer> layers;

  // The L + 2 contiguous blocks the pass acquires one at a time (param_blocks.h): block 0 the
  // token embeddings (with the output head when tied), block 1 + l layer l, block L + 1 the final
  // norm and the untied output head. They tile [0, total()).
  struct Block {
    size_t begin, end;
    size_t size() const { return end - begin; }
  };
  std::vector<Block> blocks;
  int layer_block(int l) const { return 1 + l; }
  int head_block() const { return int(blocks.size()) - 1; }
  bool tied() const { return output == tok_embeddings; }
  int output_block() const { return tied() ? 0 : head_block(); }

 private:
  size_t add(const std::string& name, std::vector<int64_t> shape, bool decay);
};

// Templated over the scalar type: float is the training model; double serves the whole-model
// finite-difference gradient test.
template <class Ops>
class Llama2Pass;  // the forward/backward pass over a backend's ops (src/model/llama2_pass.h)
namespace cpu {
template <class T>
struct PassOps;
class Bf16Matmuls;  // the bf16 path's products (src/backend/cpu/onednn/bf16_matmuls.h)
}

// Seconds a model's passes spent per op family while timing is on (Llama2ModelT::set_op_times):
// the step-time breakdown of benchmarks/cpu_train_vs_torch.sh.
struct OpTimes {
  double products = 0;     // matrix products (and, in bf16, their operands' conversions)
  double attention = 0;    // attention forward/backward and RoPE
  double elementwise = 0;  // embedding, RMSNorm, SwiGLU, residual adds, cross-entropy
};

template <class T>
class Llama2ModelT {
 public:
  // Without allocate_params, params() stays empty (ZeRO stage 3 holds only a shard, zero.h).
  explicit Llama2ModelT(const Llama2Config& cfg, bool allocate_params = true);
  ~Llama2ModelT();
  Llama2ModelT(Llama2ModelT&&) noexcept;
  Llama2ModelT& operator=(Llama2ModelT&&) noexcept;
  const Llama2Config& config() const { return cfg_; }
  const ParameterLayout& layout() const { return layout_; }

  // (layout.total()) Taking the writable reference marks the bf16 copy of the weights stale
  // (--precision bf16 converts them again at the next forward): write through it before then.
  std::vector<T>& params() {
    ++params_version_;
    return params_;
  }
  const std::vector<T>& params() const { return params_; }
  std::vector<T>& grads() { return grads_; }     // allocated by allocate_grads()
  void allocate_grads();
  void clear_grads();

  // N(0, 0.02) for matrices, 0.02/sqrt(2 n_layers) for the residual projections wo and w2
  // (GPT-2 scaling), 1 for norm weights.
  void init_random(uint64_t seed);
  // The same values for the flat range [begin, end) only, into out[0, end - begin) (a shard).
  static void init_random_range(const Llama2Config& cfg, const ParameterLayout& layout, uint64_t seed, size_t begin,
                                size_t end, T* out);

  // Forward with loss: returns the sum over tokens with mask of the cross-entropy and, when
  // token_losses is given, the per-token losses (B*T). Keeps the activations for backward().
  double forward(const Batch& batch, T* token_losses = nullptr);
  // Backward of (dloss * summed loss) after forward() on the same batch: += into grads().
  void backward(const Batch& batch, float dloss);
  // The same through parameter blocks (ZeRO stages 2 and 3, zero_blocks.h) instead of params()
  // and grads(). With --precision bf16, params() must still hold the weights (not stage 3).
  double forward(const Batch& batch, ParamBlocks<T, T>& blocks, T* token_losses = nullptr);
  void backward(const Batch& batch, float dloss, ParamBlocks<T, T>& blocks);
  // Logits of the last forward() (B*T, V). Valid until backward(), which overwrites them. With
  // --precision bf16, a forward() with targets keeps the logits only in bf16 for its loss (as
  // PyTorch's bf16 autocast does) and does not write these.
  const T* logits() const;

  // Activation recomputation (src/model/llama2_pass.h): what forward keeps for backward and what
  // backward computes again. Gradients are the same bits in every mode. Default kNone.
  void set_recompute(Recompute r);
  Recompute recompute() const;
  // Bytes of the activation buffers forward/backward use for a batch of B rows of Tn tokens in
  // the current recompute mode.
  size_t activation_bytes(int B, int Tn) const;

  // The matrix products' operand format (config.h): fp32 (default) or bf16, with fp32
  // accumulation, fp32 master weights and fp32 everything else. bf16 needs T = float and oneDNN
  // (throws lt::Error saying what is missing).
  void set_precision(Precision p);
  Precision precision() const { return precision_; }
  // bf16: the most bytes its copies for the products have held at once (Bf16Matmuls); 0 for fp32.
  size_t bf16_copy_peak_bytes() const;
  // While times is not null, forward and backward add their seconds per op family to it.
  void set_op_times(OpTimes* times) { op_times_ = times; }

  // LoRA (lora.h): adapters on the base's products, which are then frozen. After enable_lora the
  // passes apply lora_params() (A initialised from seed, B zero), and backward() writes only
  // lora_grads() (+=): no gradient of the base is computed, and grads() need not be allocated.
  // Through blocks, the base's must give no gradients (null grads(): FrozenShards, zero.h). fp32
  // products only (not --precision bf16).
  void enable_lora(const LoraConfig& cfg, uint64_t seed);
  const LoraLayout* lora() const { return lora_.get(); }
  std::vector<T>& lora_params() { return lora_params_; }
  const std::vector<T>& lora_params() const { return lora_params_; }
  std::vector<T>& lora_grads() { return lora_grads_; }
  // The dropout mask's stream of the next forward and backward (the same stream gives the same
  // mask); 0, the default, applies no dropout (evaluation).
  void set_lora_dropout_stream(uint64_t stream) { lora_stream_ = stream; }

 private:
  Llama2Config cfg_;
  ParameterLayout layout_;
  std::vector<T> params_;
  std::vector<T> grads_;
  std::unique_ptr<Llama2Pass<cpu::PassOps<T>>> pass_;  // activations live here
  Precision precision_ = Precision::kFp32;
  std::unique_ptr<cpu::Bf16Matmuls> bf16_;  // with --precision bf16: weight and operand copies
  uint64_t params_version_ = 0;             // counts params() writable accesses
  OpTimes* op_times_ = nullptr;
  std::unique_ptr<LoraLayout> lora_;        // enable_lora; the pass points at it
  std::vector<T> lora_params_, lora_grads_;
  uint64_t lora_stream_ = 0;

  cpu::PassOps<T> pass_ops(const Batch& batch);
  ParamBlocks<T, T>& pass_blocks(ParamBlocks<T, T>& blocks, std::unique_ptr<ParamBlocks<T, T>>* wrapper);
  void check_batch(const Batch& batch) const;
  void bind_lora(cpu::PassOps<T>& ops);  // hands the adapters (if any) to the pass and its ops
};

extern template class Llama2ModelT<float>;
extern template class Llama2ModelT<double>;
using Llama2Model = Llama2ModelT<float>;

}  // namespace lt
