// What every engine shares: the host's view of a rank's shard.
#include "llamatrain/engine.h"

namespace lt {

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
