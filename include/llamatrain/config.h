// Llama 2 model configuration and the named presets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

struct Llama2Config {
  int dim = 0;          // model width C
  int hidden_dim = 0;   // SwiGLU inner width F
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;   // GQA: head h uses KV head h / (n_heads / n_kv_heads)
  int vocab_size = 0;
  int max_seq_len = 0;
  float norm_eps = 1e-5f;      // RMSNorm epsilon
  float rope_theta = 10000.f;  // RoPE base, Meta layout: adjacent pairs (i, i+1) per head
  bool tied_embeddings = false;  // output head shares tok_embeddings (llama2.c "shared classifier")

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_dim(); }
  // Throws lt::Error naming the first inconsistent field.
  void validate() const;
  std::string to_string() const;
  // The inverse of to_string() (checkpoints record the config that way); throws lt::Error naming
  // `origin` and the field that is missing or malformed, then validates.
  static Llama2Config from_string(const std::string& s, const std::string& origin);
  // Parameters of the model (tied head counted once).
  int64_t num_parameters() const;
  // Training FLOPs per token (6N + attention 12*L*C*T for context T, the PaLM convention).
  double flops_per_token(int seq_len) const;
};

// Activation recomputation (llama2_pass.h's header says which buffers each mode keeps): the
// trainer's and the planner's --recompute.
enum class Recompute { kNone, kAttn, kFull };
const char* recompute_name(Recompute r);

// The number format of the matrix products' operands on the CPU backend (--precision): fp32 (the
// default and the reference) or bf16 (bf16 weights and activations into oneDNN products with fp32
// accumulation; everything else fp32). The CUDA backend always computes in bf16.
enum class Precision { kFp32, kBf16 };
const char* precision_name(Precision p);

// The attention implementation of the CUDA backend (--attention): ours (kNative, every device) or
// cuDNN's fused attention (kCudnn: a GPU only, one example per row).
enum class Attention { kNative, kCudnn };
const char* attention_name(Attention a);

// Named presets: llama2-7b, llama2-13b, llama2-70b, stories260k, stories15m, stories42m,
// stories110m, tiny. Throws lt::Error listing the valid names for an unknown one.
Llama2Config preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace lt
