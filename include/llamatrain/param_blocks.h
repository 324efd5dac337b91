// How the forward/backward pass (src/model/llama2_pass.h) reaches the weights and the gradient
// storage: one parameter block at a time (ParameterLayout::blocks: the embeddings, each layer, the
// final norm with the head). The pass acquires a block before it reads the block's weights and
// releases it after, and tells when the block's gradients are final for this backward. A
// ZeRO-3 model gathers a block from the ranks' shards at acquire() and frees it at release(); a
// true ZeRO-2 model gives each block gradient scratch and reduce-scatters it into the rank's
// shard at grads_done() (src/optim/zero_blocks.cpp). The plain flat buffer is the trivial case.
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
};

}  // namespace lt
