// What every engine shares: the host state's shape, the host optimizer's step, LoRA's dropout
// streams, the host's view of a rank's shard.
#include "llamatrain/engine.h"

namespace lt {

bool host_holds_only_shard(DeviceKind device, int zero_stage, bool lora) {
  if (lora) return zero_stage == 3;  // the adapters' optimizer is the host's on every device
  return zero_stage == 3 || (device != DeviceKind::cpu && zero_stage >= 1);
}

double host_optimizer_step(Llama2Model& model, ZeroOptimizer& zero, float lr, float max_norm, int64_t step) {
  // Null where the host holds only this rank's shard (ZeRO 2 and 3 on the CPU, zero.h).
  float* params = zero.sharded_params() ? nullptr : model.lora() ? model.lora_params().data() : model.params().data();
  float* grads = zero.sharded_grads() ? nullptr : model.lora() ? model.lora_grads().data() : model.grads().data();
  zero.finish_reduction(grads);
  const double norm = zero.clip(grads, max_norm);
  zero.step(params, grads, lr, step);
  return norm;
}

uint64_t lora_dropout_stream(int64_t step, int rank, int micro) {
  return 1 + uint64_t(step) * 0x10000 + uint64_t(rank) * 0x100 + uint64_t(micro);
}

ShardView host_shard_view(Llama2Model& model, ZeroOptimizer& zero, int rank) {
  AdamW& adam = zero.adamw();
  ShardView view;
  view.begin = zero.shards().begin(rank);
  view.end = zero.shards().end(rank);
  // What the optimizer trains: LoRA's adapters, else the weights (zero's shard where the host holds only that).
  float* whole = model.lora() ? model.lora_params().data() : model.params().data();
  view.params = zero.sharded_params() ? zero.shard_params().data() + (view.begin - zero.own_begin()) : whole + view.begin;
  view.m = adam.m().data() + (view.begin - adam.begin());
  view.v = adam.v().data() + (view.begin - adam.begin());
  return view;
}

}  // namespace lt
