// How the forward/backward pass (src/model/llama2_pass.h) reaches the weights and the gradient
// storage: one parameter block at a time (ParameterLayout::blocks: the embeddings, each layer, the
// final norm with the head). The pass acquires a block before it reads the block's weights and
// releases it after, and tells when the block's gradients are final for this backward. A
// ZeRO-3 model gathers a block from the ranks' shards at acquire() and frees it at release(); a
// true ZeRO-2 model gives each block gradient scratch and reduce-scatters it into the rank's
// shard at grads_done() (src/optim/zero_blocks.cpp). The plain flat buffer is the trivial case.
// prefetch(b) names the block the pass will acquire next (the device's ZeRO 3 starts its gather
// there).
#pragma once

namespace lt {

template <class Param, class Grad>
class ParamBlocks {
 public:
  virtual ~ParamBlocks() = default;
  // Block b's weights, element 0 at the block's first flat offset; valid until release(b).
  virtual const Param* acquire(int b) = 0;
  virtual void release(int b) = 0;
  // Where backward adds block b's gradients (element 0 at the block's first flat offset), valid
  // until grads_done(b), after which no gradient of block b changes in this backward.
  virtual Grad* grads(int b) = 0;
  virtual void grads_done(int b) = 0;
  // Block b is the next one the pass will acquire: a sharded model may start gathering it now, so
  // that the gather runs under the current block's compute. A hint (nothing by default), but a
  // collective where it does something: every rank makes the same calls in the same order.
  virtual void prefetch(int /*b*/) {}
};

}  // namespace lt
