// ZeRO-style data parallelism over the flat parameter buffer (DESIGN.md "Distributed training"),
// on host buffers; the shards, the buckets and the order of the collectives are the plan's
// (zero_plan.h), which the device's ZeRO (src/backend/cuda/device_zero.h) follows too.
//  stage 0: gradients are all-reduced, every rank keeps Adam m, v for all N and updates all of it;
//  stage 1: each rank keeps m, v for its shard only, updates its shard and the shards are
//           all-gathered; the gradient buffer is whole and reduce-scattered bucket by bucket (each
//           rank receives only its shard of the sum: half the traffic of an all-reduce);
//  stage 2: as stage 1, with the gradients kept only as the rank's shard: the backward pass writes
//           each block's gradients to scratch that is reduce-scattered into the shard as soon as
//           the block is done, every micro-batch (zero_blocks.h).
//  stage 3: as stage 2, and each rank keeps only its shard of the weights: the passes gather
//           each block just before use and free it after (zero_blocks.h). The CPU in fp32, and
//           cuda-sim (src/backend/cuda/device_zero_blocks.h); not yet verified on a GPU.
// The clipping norm is the global one: each rank's sum of squares over its shard, all-reduced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "llamatrain/comm.h"
#include "llamatrain/comm_wait.h"
#include "llamatrain/model.h"
#include "llamatrain/optim.h"
#include "llamatrain/zero_blocks.h"
#include "llamatrain/zero_plan.h"

namespace lt {

// The cut into shards (ShardLayout), the buckets and the collectives: zero_plan.h.

// Bytes per rank of what training holds, from the sizes alone (the CPU backend keeps fp32
// everywhere): the working parameters (stage 3: the rank's shard), the gradient buffer (stages 2
// and 3: the rank's shard), Adam m and v, activations, and the blocks gathered and the gradient
// scratch held at once (stages 2 and 3, block_bytes: zero_block_bytes()).
struct MemoryRow {
  int rank = 0;
  double params = 0, grads = 0, optimizer = 0, activations = 0, gathered = 0;
  double workspace = 0;  // the CUDA backend's cuBLASLt workspace (device_memory_table)
  double total() const { return params + grads + optimizer + activations + gathered + workspace; }
};
// The cuBLASLt workspace a CUDA process allocates once (src/backend/cuda/matmul.cu; the size
// cuBLASLt recommends on Hopper).
constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;
// shard_grad_bytes: bytes per element of the gradient shard of stages 2 and 3 (4, or 2 with
// --grad-reduce-dtype bf16: grad_shard.h); stages 0 and 1 keep a full fp32 buffer.
std::vector<MemoryRow> memory_table(size_t n_params, int world, int zero_stage, double activation_bytes_per_rank,
                                    double block_bytes = 0, double shard_grad_bytes = 4);
// The most bytes of gathered weights and gradient scratch a rank holds at once in a forward and
// backward pass with ZeRO stage 2 or 3 (0 for stages 0 and 1), at weight_bytes per gathered
// weight and grad_bytes per gradient element: what ZeroBlocks::peak_bytes() reaches on the CPU
// (4 and 4; zero_blocks.h); the planner's GPU stage 3 uses 2 (bf16) and 4.
double zero_block_bytes(const ParameterLayout& layout, int zero_stage, double weight_bytes = 4,
                        double grad_bytes = 4);
// What --precision bf16 adds on the CPU (src/backend/cpu/onednn/bf16_matmuls.h, held at once
// over a pass of B rows of T tokens; Bf16Matmuls::peak_bytes() measures the same): the bf16 copy
// of the whole (padded) weights at stages 0-2 (`weights`), at stage 3 one layer's matrices instead
// (plus the tied embeddings'; `blocks`), and the copies of the products' operands (`operands`):
// per layer xn1, the attention output, xn2 and the SwiGLU output (one layer's with --recompute
// full; the attention output shared by the layers with attn), the final norm's output and the
// logits, the backward's dx, dq, dk, dv, dh1 and dh3, and the cross-entropy's two fp32 rows.
struct Bf16CopyBytes {
  double weights = 0, blocks = 0, operands = 0;
};
Bf16CopyBytes cpu_bf16_copy_bytes(const Llama2Config& c, size_t padded, int zero_stage, int B, int T, Recompute r);
// The same for the CUDA backend (src/backend/cuda/device_zero.h), what its device allocates: bf16
// working weights (stages 0-2 whole and padded, 3 the rank's shard), fp32 gradients (stages 0, 1 a
// whole padded buffer, 2 and 3 the rank's shard at shard_grad_bytes), fp32 master weights and Adam
// m, v of the rank's range, for stages 2 and 3 the slots of fp32 gradient scratch and for stage 3
// of gathered bf16 blocks (the block in use and zero3_prefetch ahead, the tied embeddings held all
// pass long). offload_optimizer (train --offload-optimizer): master, m, v stay on the host, so the
// optimizer column is 0.
// activation_bytes: the device pass's for the micro-batch; workspace: cuBLASLt's. Not counted: the
// batch and loss slots (kilobytes) and the bf16 wire scratch of --grad-reduce-dtype bf16 (at most
// 64 MiB).
std::vector<MemoryRow> device_memory_table(const ParameterLayout& layout, int world, int zero_stage,
                                           double activation_bytes, double shard_grad_bytes = 4,
                                           int zero3_prefetch = 1, bool offload_optimizer = false);
// The bf16 weights a device's ZeRO 3 blocks hold gathered at once (their slots): none on one rank
// (its shard is the whole model), else the widest block's, once more with zero3_prefetch, and the
// tied embeddings' slot. A device's LoRA at ZeRO 3 holds them for its frozen base too.
double device_gathered_weight_bytes(const ParameterLayout& layout, int world, int zero3_prefetch);
// A LoRA run's rows, as train's start-of-run table and the planner count them: the adapters' table
// (memory_table of `adapters` values at stage min(zero_stage, 1), their optimizer's) with the frozen
// base of `base` beside it: whole, or at zero_stage 3 the rank's shard and the blocks gathered at once
// (no gradient scratch). The CPU (device false) holds all in fp32; a device holds the base and the
// adapters' working copy in bf16 (its gather slots with zero3_prefetch), their gradients in fp32,
// and no optimizer state (the host updates the adapters: register.cu), plus cuBLASLt's workspace.
std::vector<MemoryRow> lora_memory_table(const ParameterLayout& base, size_t adapters, int world, int zero_stage,
                                         double activation_bytes, bool device, int zero3_prefetch = 1);
// lora: the rows are a LoRA run's (lora_memory_table).
std::string format_memory_table(const std::vector<MemoryRow>& rows, int zero_stage, const char* grad_shard_dtype = "fp32",
                                bool lora = false);

// LoRA at ZeRO 3: the frozen base held as this rank's shard of the model's flat buffer (the same
// cut as ZeroOptimizer's over a model), which the passes gather a block at a time through blocks()
// and free after use, computing no gradient of it. The adapters, a fraction of a percent of the
// model, keep their own optimizer (ZeroOptimizer over LoraLayout's table).
class FrozenShards {
 public:
  FrozenShards(Comm& comm, const ParameterLayout& layout);
  FrozenShards(const FrozenShards&) = delete;
  FrozenShards& operator=(const FrozenShards&) = delete;
  const ShardLayout& shards() const { return shards_; }
  size_t own_begin() const { return own_begin_; }
  size_t own_end() const { return own_end_; }
  // This rank's shard: element 0 at flat offset own_begin(); zeros for the caller to fill.
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  ZeroBlocks& blocks() { return *blocks_; }
  // Bytes this rank sent through the gathers so far.
  CommVolume volume() const { return comm_ ? comm_->volume() : CommVolume{}; }

 private:
  ShardLayout shards_;
  size_t own_begin_, own_end_;
  std::vector<float> params_;
  std::unique_ptr<HostZeroComm> comm_;  // null for one rank
  std::unique_ptr<ZeroBlocks> blocks_;
};

class ZeroOptimizer final : public ZeroSteps {
 public:
  // grad_reduce: the dtype gradients cross the wire in (kF32, or kBF16: half the bytes, each
  // element rounded to nearest before the sum and the sum in fp32 per pair) and, with sharded
  // gradients, the shard's dtype (grad_shard.h). bucket_bytes: the plan's gradient buckets
  // (--bucket-mb).
  ZeroOptimizer(Comm& comm, const ParameterLayout& layout, int stage, AdamWConfig cfg,
                DType grad_reduce = DType::kF32, size_t bucket_bytes = kDefaultBucketMiB << 20);
  // Over a flat table of tensors that are not a model's layout (LoRA's adapters,
  // LoraLayout::tensors): stages 0 and 1 only (the passes' blocks of stages 2 and 3 are a model's;
  // a LoRA run at stage 2 or 3 trains its adapters at stage 1, and stage 3 shards the frozen base:
  // FrozenShards).
  ZeroOptimizer(Comm& comm, const std::vector<TensorInfo>& tensors, size_t total, int stage, AdamWConfig cfg,
                DType grad_reduce = DType::kF32);
  DType grad_reduce() const { return grad_reduce_; }
  Comm& comm() const { return comm_; }
  // Parameter and gradient buffers must hold this many floats (zeros past layout.total()).
  size_t padded_size() const { return plan_.shards().padded; }
  // The step on host buffers (the plan's, on the host: no prefetch): finish_reduction sums the
  // ranks' gradients bucket by bucket (all of grads for stage 0, this rank's shard for stage 1, the
  // rest of grads left unspecified; with sharded gradients the blocks did it already), clip scales
  // the part this rank uses (grads: the full buffer, or null with sharded gradients; ZeroSteps),
  // then step: AdamW on the part this rank owns, and (stages 1, 2) every rank gets every shard.
  // params: the full buffer (null for stage 3); grads as above.
  void step(float* params, const float* grads, float lr, int64_t t);

  // CPU stages 2 and 3 (sharded_grads()): the rank's shard of the summed gradient, the rank's
  // shard of the weights (stage 3: element 0 at flat offset own_begin(), copied from full_params
  // here, after which the caller may free them; when null, those hold_shard_params() made, or
  // zeros for the caller to fill), and the blocks the passes read weights and write gradients
  // through, bound to the full weights for stage 2.
  void shard_gradients(const float* full_params);
  // Stages 1-3 where the host keeps only its shard (engine.h, host_holds_only_shard; a device
  // keeps the working weights, gradients and optimizer state itself): the host's shard of the
  // weights, zeros for the caller to fill, as checkpoints and the final model read it (issue 18:
  // host memory of one shard).
  void hold_shard_params();
  bool sharded_grads() const { return blocks_ != nullptr; }
  // The host holds only this rank's shard of the weights (shard_params()): stage 3, and stages 1
  // and 2 on a device.
  bool sharded_params() const { return stage() == 3 || holds_shard_params_; }
  ZeroBlocks& blocks() { return *blocks_; }
  GradShard& shard_grads() { return shard_grads_; }
  std::vector<float>& shard_params() { return shard_params_; }
  const std::vector<float>& shard_params() const { return shard_params_; }
  void clear_shard_grads();
  // Bytes of optimizer state held by this rank.
  size_t optimizer_bytes() const;
  // The Adam state this rank holds: m, v over [own_begin, own_end) of the flat buffer (all of it
  // for stage 0, this rank's shard otherwise).
  AdamW& adamw() { return adamw_; }
  const AdamW& adamw() const { return adamw_; }

 private:
  ZeroOptimizer(Comm& comm, const std::vector<TensorInfo>& tensors, DType grad_reduce, ZeroPlan plan,
                const ParameterLayout* layout, AdamWConfig cfg);
  double own_sum_squares(float* grads) override;
  void scale_own(float* grads, float s) override;
  Comm& comm_;
  const ParameterLayout* layout_;  // null over a flat table: no blocks
  DType grad_reduce_;
  std::unique_ptr<HostZeroComm> zc_;  // null for one rank
  AdamW adamw_;
  std::unique_ptr<ZeroBlocks> blocks_;
  GradShard shard_grads_;
  std::vector<float> shard_params_;
  bool holds_shard_params_ = false;  // hold_shard_params()
};

}  // namespace lt
