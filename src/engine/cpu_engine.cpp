// The CPU engine: the model's passes on this process's cores (src/backend/cpu through
// model/llama2_pass.h) and the ZeRO optimizer on host buffers (optim/zero.cpp). With ZeRO 2 and 3
// the passes read weights and write gradients through the optimizer's blocks, which gather and
// reduce inside them; with 0 and 1 the model holds the whole weights and gradients. With LoRA
// (model.lora()) the optimizer trains the adapters (at ZeRO 0 and 1; 2 is 1 for them) and the base
// stays as loaded: whole, or at ZeRO 3 as this rank's shard that the passes gather a block at a
// time (FrozenShards), computing no gradient of it.
#include <omp.h>

#include "llamatrain/engine.h"
#include "llamatrain/error.h"

namespace lt {

namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(Llama2Model& model, ZeroOptimizer& zero, FrozenShards* frozen_base)
      : model_(model),
        zero_(zero),
        frozen_(frozen_base),
        blocks_(zero.sharded_grads() ? &zero.blocks() : frozen_base ? &frozen_base->blocks() : nullptr) {}

  void begin_step(int64_t step) override {
    if (zero_.sharded_grads()) zero_.clear_shard_grads();
    else model_.clear_grads();
    loss_sum_ = 0;
    step_ = step;
    micro_ = 0;
  }

  void forward_backward(const Batch& b, float dloss, bool) override {
    // LoRA's dropout: one mask per (step, rank, micro-batch), the same in a rerun of the step.
    if (model_.lora()) model_.set_lora_dropout_stream(lora_dropout_stream(step_, zero_.comm().rank(), micro_++));
    if (blocks_) {
      loss_sum_ += model_.forward(b, *blocks_);
      model_.backward(b, dloss, *blocks_);
    } else {
      loss_sum_ += model_.forward(b);
      model_.backward(b, dloss);
    }
  }

  void idle_round() override {
    if (!blocks_) return;  // ZeRO 0 and 1 reduce once, after the passes
    idle_forward_blocks(*blocks_, model_.layout());
    idle_backward_blocks(*blocks_, model_.layout());
  }

  StepResult finish_step(float lr, float max_norm, int64_t step) override {
    StepResult r;
    r.grad_norm = host_optimizer_step(model_, zero_, lr, max_norm, step);
    r.loss_sum = loss_sum_;
    return r;
  }

  void set_op_times(OpTimes* times) override { model_.set_op_times(times); }

  double forward(const Batch& b) override {
    model_.set_lora_dropout_stream(0);  // evaluation: no dropout
    return blocks_ ? model_.forward(b, *blocks_) : model_.forward(b);
  }

  void idle_forward() override {
    if (zero_.stage() == 3 || frozen_) idle_forward_blocks(*blocks_, model_.layout());  // only ZeRO 3's forward gathers
  }

  void load_host_state() override {}  // the host's state is the engine's

  ShardView host_state(int rank) override { return host_shard_view(model_, zero_, rank); }

  // ZeRO 0-2 update the whole weights on every rank, ZeRO 3 its shard: already where they belong.
  void gather_weights() override {}

  DeviceInfo info() override { return cpu_device_info(omp_get_max_threads(), model_.precision()); }
  std::string description() const override {
    return strcat("CPU, ", omp_get_max_threads(), " threads, ", precision_name(model_.precision()));
  }
  size_t activation_bytes(int b, int T) const override { return model_.activation_bytes(b, T); }

  EngineCounters counters() override {
    EngineCounters c;
    c.comm = zero_.volume();
    if (frozen_) c.comm.allgather += frozen_->volume().allgather;
    c.pass_comm_s = blocks_ ? blocks_->comm_seconds() : 0.0;
    return c;
  }

  size_t bf16_copy_peak_bytes() const override { return model_.bf16_copy_peak_bytes(); }

 private:
  Llama2Model& model_;
  ZeroOptimizer& zero_;
  FrozenShards* frozen_;  // LoRA at ZeRO 3: the base's shards; else null
  ZeroBlocks* blocks_;    // what the passes read weights (and write gradients) through; null: the flat buffers
  double loss_sum_ = 0;  // this step's micro-batches
  int64_t step_ = 0;
  int micro_ = 0;        // this step's micro-batches so far
};

class CpuEvaluator final : public Evaluator {
 public:
  explicit CpuEvaluator(Llama2Model& model) : model_(model) {}
  double forward(const Batch& b, float* token_losses) override { return model_.forward(b, token_losses); }
  std::string description() const override {
    return strcat("CPU, ", omp_get_max_threads(), " threads, ", precision_name(model_.precision()));
  }

 private:
  Llama2Model& model_;
};

}  // namespace

std::unique_ptr<Evaluator> make_cpu_evaluator(Llama2Model& model) { return std::make_unique<CpuEvaluator>(model); }

std::unique_ptr<Engine> make_cpu_engine(Llama2Model& model, ZeroOptimizer& zero, FrozenShards* frozen_base) {
  if (model.lora()) {
    // The adapters' gradients are the caller's; the base has none.
  } else if (zero.stage() >= 2) {
    zero.shard_gradients(zero.stage() == 2 ? model.params().data() : nullptr);  // gradients only as this rank's shard
  } else {
    model.allocate_grads();
    model.grads().resize(zero.padded_size(), 0.f);
  }
  return std::make_unique<CpuEngine>(model, zero, frozen_base);
}

}  // namespace lt
