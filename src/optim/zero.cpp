#include "llamatrain/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/safetensors.h"

namespace lt {

using safetensors::bf16_to_f32;
using safetensors::f32_to_bf16;

std::vector<MemoryRow> memory_table(size_t n_params, int world, int zero_stage, double activation_bytes,
                                    double block_bytes, double shard_grad_bytes) {
  const ShardLayout s(n_params, world);
  std::vector<MemoryRow> rows;
  for (int r = 0; r < world; ++r) {
    MemoryRow m;
    m.rank = r;
    const double shard = double(s.end(r) - s.begin(r));
    // The working copy every rank computes with (stage 3: its shard; the blocks are gathered).
    m.params = 4.0 * (zero_stage == 3 ? shard : double(s.padded));
    // Accumulated over the rank's micro-batches and reduced in place; stages 2, 3: the shard.
    m.grads = zero_stage >= 2 ? shard_grad_bytes * shard : 4.0 * double(s.padded);
    m.optimizer = 8.0 * (zero_stage == 0 ? double(n_params) : shard);  // Adam m and v, fp32
    m.activations = activation_bytes;
    m.gathered = zero_stage >= 2 ? block_bytes : 0.0;
    rows.push_back(m);
  }
  return rows;
}

double zero_block_bytes(const ParameterLayout& layout, int zero_stage, double weight_bytes, double grad_bytes) {
  if (zero_stage < 2) return 0;
  const std::vector<ParameterLayout::Block>& b = layout.blocks;
  double widest = double(b.back().size());  // the head block, then the widest layer
  for (int l = 0; l < int(layout.layers.size()); ++l) widest = std::max(widest, double(b[size_t(layout.layer_block(l))].size()));
  const double emb = double(b[0].size());
  // Held at once (llama2_pass.h): stage 2 one block's gradient scratch, with a tied head the
  // embeddings' too, all backward long; stage 3 also the block's gathered weights (and the tied
  // embeddings' all pass long). An untied stage 3 forward starts with the embeddings' weights alone
  // and its backward ends with their gradients alone. grad_bytes 0: a frozen model (FrozenShards).
  const double g = grad_bytes, wg = weight_bytes + grad_bytes;
  if (zero_stage == 2) return g * (layout.tied() ? emb + widest : std::max(emb, widest));
  return layout.tied() ? wg * (emb + widest) : std::max({weight_bytes * emb, g * emb, wg * widest});
}

Bf16CopyBytes cpu_bf16_copy_bytes(const Llama2Config& c, size_t padded, int zero_stage, int B, int T, Recompute r) {
  const bool tied = ParameterLayout(c).tied();
  const double N = double(B) * T, C = c.dim, F = c.hidden_dim, V = c.vocab_size, L = c.n_layers;
  const double kv = double(c.n_kv_heads) * (c.dim / c.n_heads);
  Bf16CopyBytes b;
  if (zero_stage < 3) {
    b.weights = 2.0 * double(padded);
  } else {
    const double layer = 2 * C * C + 2 * C * kv + 3 * C * F;  // wq, wo, wk, wv, w1, w2, w3
    b.blocks = 2.0 * (std::max(layer, V * C) + (tied ? V * C : 0.0));
  }
  const double per_layer = r == Recompute::kFull ? 3 * C + F : L * (3 * C + F) - (r == Recompute::kAttn ? (L - 1) * C : 0);
  b.operands = 2.0 * N * (per_layer + C + V + 2 * C + 2 * kv + 2 * F) + 8.0 * N;
  return b;
}

namespace {
// The slots of the device's stages 2 and 3 (device_zero_blocks.h), each sized for the largest block
// it has held: the widest block other than the tied embeddings, which keep a slot of their own.
struct DeviceSlotSizes {
  double widest = 0, emb = 0;
  explicit DeviceSlotSizes(const ParameterLayout& layout) {
    const auto& b = layout.blocks;
    for (size_t i = layout.tied() ? 1 : 0; i < b.size(); ++i) widest = std::max(widest, double(b[i].size()));
    emb = layout.tied() ? double(b[0].size()) : 0.0;
  }
};
}  // namespace

double device_gathered_weight_bytes(const ParameterLayout& layout, int world, int zero3_prefetch) {
  const DeviceSlotSizes s(layout);
  return world > 1 ? 2.0 * (s.emb + (1 + zero3_prefetch) * s.widest) : 0.0;
}

std::vector<MemoryRow> lora_memory_table(const ParameterLayout& base, size_t adapters, int world, int zero_stage,
                                         double activation_bytes, bool device, int zero3_prefetch) {
  std::vector<MemoryRow> rows = memory_table(adapters, world, std::min(zero_stage, 1), activation_bytes);
  const bool sharded = zero_stage == 3;
  const double weight_bytes = device ? 2.0 : 4.0;
  const ShardLayout s(base.total(), world);
  const double gathered = !sharded ? 0.0
                          : device ? device_gathered_weight_bytes(base, world, zero3_prefetch)
                                   : zero_block_bytes(base, 3, weight_bytes, 0);
  for (MemoryRow& r : rows) {
    if (device) {
      r.params *= 0.5;  // the adapters' bf16 working copy
      r.optimizer = 0;
      r.workspace = double(kCublasLtWorkspaceBytes);
    }
    r.params += weight_bytes * double(sharded ? s.end(r.rank) - s.begin(r.rank) : base.total());
    r.gathered = gathered;
  }
  return rows;
}

std::vector<MemoryRow> device_memory_table(const ParameterLayout& layout, int world, int zero_stage,
                                           double activation_bytes, double shard_grad_bytes, int zero3_prefetch,
                                           bool offload_optimizer) {
  const size_t n = layout.total();
  std::vector<MemoryRow> rows = memory_table(n, world, zero_stage, activation_bytes, 0.0, shard_grad_bytes);
  const ShardLayout s(n, world);
  const DeviceSlotSizes slot(layout);
  // bf16 weights gathered (stage 3) and fp32 gradient scratch (stages 2, 3).
  const double weight_slots = zero_stage == 3 ? device_gathered_weight_bytes(layout, world, zero3_prefetch) : 0.0;
  const double grad_slots = zero_stage >= 2 ? 4.0 * (slot.emb + slot.widest) : 0.0;
  for (MemoryRow& m : rows) {
    const double own = zero_stage == 0 ? double(n) : double(s.end(m.rank) - s.begin(m.rank));
    m.params *= 0.5;                                      // bf16
    if (zero_stage < 2) m.grads = 4.0 * double(s.padded);  // one fp32 buffer, reduced in buckets
    m.optimizer = offload_optimizer ? 0.0 : 12.0 * own;   // fp32 master, m, v
    m.gathered = weight_slots + grad_slots;
    m.workspace = double(kCublasLtWorkspaceBytes);
  }
  return rows;
}

std::string format_memory_table(const std::vector<MemoryRow>& rows, int zero_stage, const char* grad_shard_dtype,
                                bool lora) {
  auto mib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%10.2f", b / (1024.0 * 1024.0));
    return std::string(buf);
  };
  std::string out = strcat("memory per rank (MiB), ZeRO stage ", zero_stage, ":\n",
                           "  rank      params       grads   optimizer activations       total\n");
  for (const MemoryRow& m : rows) {
    char head[16];
    std::snprintf(head, sizeof head, "  %4d  ", m.rank);
    out += head + mib(m.params) + "  " + mib(m.grads) + "  " + mib(m.optimizer) + "  " + mib(m.activations) + "  " +
           mib(m.total()) + "\n";
  }
  if (rows[0].workspace > 0)
    out += strcat("  (CUDA backend: bf16 working parameters, fp32 gradients; optimizer = fp32 master weights and\n"
                  "   Adam m, v of the parameters the rank updates; activations for one micro-batch; the total adds",
                  mib(rows[0].workspace), " MiB of cuBLASLt workspace)\n");
  else
    out += strcat("  (fp32 working parameters, ", zero_stage >= 2 ? grad_shard_dtype : "fp32",
                  " gradients; optimizer = Adam m, v of the parameters the rank updates;\n"
                  "   activations estimated for one micro-batch)\n");
  if (lora) {
    out += rows[0].workspace > 0
               ? "  (LoRA: params = the adapters' bf16 copy, grads = theirs in fp32, whole; their optimizer runs on the host\n"
                 "   (fp32 master and Adam m, v in host memory); params add the bf16\n"
               : "  (LoRA: grads and optimizer = the adapters', reduce-scattered and sharded from stage 1 on; params add the\n";
    out += zero_stage == 3 ? strcat("   frozen base: the rank's shard of it, and the total adds", mib(rows[0].gathered),
                                    " MiB of its blocks gathered at once)\n")
                           : std::string("   frozen base, whole)\n");
    return out;
  }
  if (zero_stage == 2 && rows[0].gathered > 0)
    out += strcat("  (stage 2: grads = the rank's shard; the total adds", mib(rows[0].gathered),
                  " MiB of gradient scratch, one block at a time)\n");
  if (zero_stage == 3)
    out += strcat("  (stage 3: params and grads = the rank's shard; the total adds", mib(rows[0].gathered),
                  " MiB of gathered blocks and their gradient scratch held at once)\n");
  return out;
}

FrozenShards::FrozenShards(Comm& comm, const ParameterLayout& layout)
    : shards_(layout.total(), comm.size()),
      own_begin_(shards_.begin(comm.rank())),
      own_end_(shards_.end(comm.rank())),
      params_(own_end_ - own_begin_, 0.f) {
  if (comm.size() > 1) comm_ = std::make_unique<HostZeroComm>(comm, shards_, DType::kF32);
  blocks_ = std::make_unique<ZeroBlocks>(comm_.get(), layout, shards_, comm.rank(), 3);
  blocks_->bind(params_.data(), nullptr);
}

ZeroOptimizer::ZeroOptimizer(Comm& comm, const ParameterLayout& layout, int stage, AdamWConfig cfg, DType grad_reduce,
                             size_t bucket_bytes)
    : ZeroOptimizer(comm, layout.tensors(), grad_reduce,
                    ZeroPlan(layout, comm.size(), stage, ZeroPlanOptions{bucket_bytes, false, false}), &layout, cfg) {}

ZeroOptimizer::ZeroOptimizer(Comm& comm, const std::vector<TensorInfo>& tensors, size_t total, int stage,
                             AdamWConfig cfg, DType grad_reduce)
    : ZeroOptimizer(comm, tensors, grad_reduce, ZeroPlan(total, comm.size(), stage), nullptr, cfg) {}

ZeroOptimizer::ZeroOptimizer(Comm& comm, const std::vector<TensorInfo>& tensors, DType grad_reduce, ZeroPlan plan,
                             const ParameterLayout* layout, AdamWConfig cfg)
    : ZeroSteps(std::move(plan), comm.rank()),
      comm_(comm),
      layout_(layout),
      grad_reduce_(grad_reduce),
      adamw_(tensors, plan_.shards().n, own_begin_, own_end_, cfg) {
  LT_CHECK(grad_reduce == DType::kF32 || grad_reduce == DType::kBF16, "gradient reduction dtype ", dtype_name(grad_reduce));
  if (comm.size() > 1) zc_ = std::make_unique<HostZeroComm>(comm, plan_.shards(), grad_reduce);
  set_comm(zc_.get());
}

void ZeroOptimizer::shard_gradients(const float* full_params) {
  const int stage = this->stage();
  LT_CHECK(stage >= 2, "sharded gradients need ZeRO stage 2 or 3, not ", stage);
  LT_CHECK(stage == 3 || full_params, "ZeRO stage 2: no weights");
  if (stage == 3 && full_params) shard_params_.assign(full_params + own_begin_, full_params + own_end_);
  if (stage == 3 && !full_params && !holds_shard_params_) shard_params_.assign(own_end_ - own_begin_, 0.f);
  LT_CHECK(layout_, "ZeRO stage ", stage, "'s blocks need a model's layout");
  blocks_ = std::make_unique<ZeroBlocks>(zc_.get(), *layout_, plan_.shards(), comm_.rank(), stage,
                                         plan_.options().prefetch);
  shard_grads_.assign(own_end_ - own_begin_, grad_reduce_);
  blocks_->bind(stage == 3 ? shard_params_.data() : full_params, &shard_grads_);
}

void ZeroOptimizer::clear_shard_grads() { shard_grads_.zero(); }

double ZeroOptimizer::own_sum_squares(float* grads) {
  if (sharded_grads()) return shard_grads_.sum_squares(0, own_end_ - own_begin_);
  return cpu::sum_squares(grads + own_begin_, own_end_ - own_begin_);
}

void ZeroOptimizer::scale_own(float* grads, float s) {
  if (sharded_grads()) shard_grads_.scale(s);
  else cpu::scale_inplace(grads + own_begin_, s, own_end_ - own_begin_);
}

void ZeroOptimizer::step(float* params, const float* grads, float lr, int64_t t) {
  float* mine = stage() == 3 ? shard_params_.data() : params + own_begin_;
  if (sharded_grads()) {
    shard_grads_.for_windows(kCommWindow, [&](size_t at, const float* g, size_t n) {
      adamw_.step_window(mine + at, g, own_begin_ + at, own_begin_ + at + n, lr, t);
    });
  } else {
    adamw_.step_slice(mine, grads + own_begin_, lr, t);
  }
  gather_weights(params, "weights");
}

void ZeroOptimizer::hold_shard_params() {
  LT_CHECK(stage() >= 1, "ZeRO stage 0 holds the whole weights");
  shard_params_.assign(own_end_ - own_begin_, 0.f);
  holds_shard_params_ = true;
}

size_t ZeroOptimizer::optimizer_bytes() const { return 2 * sizeof(float) * (own_end_ - own_begin_); }

}  // namespace lt
