// The CPU backend's ZeRO-2 and ZeRO-3 parameter blocks (param_blocks.h, DESIGN.md "Distributed
// training"). The shards are those of ZeroOptimizer: rank r owns [begin(r), end(r)) of the flat
// buffer, the same cut in every stage, so a checkpoint of any stage loads in any other. A block
// (the embeddings, a layer, the head) overlaps one or more shards; its piece in rank r's shard is
// what rank r contributes to and receives of it (allgather_v / reduce_scatter_v_sum, comm.h).
//  stage 2  every rank holds all the weights (acquire is the block's range of them); gradients
//           go to scratch of one block, which grads_done reduce-scatters into the rank's shard
//           of the gradient and frees: no full-size gradient buffer, a reduction per micro-batch
//           and block (as DeepSpeed's ZeRO-2).
//  stage 3  as stage 2 for gradients, and the weights too are only the rank's shard: acquire (or
//           prefetch, where the plan says so) all-gathers the block into a buffer that release frees.
// The collectives are the plan's (zero_plan.h), issued through HostZeroComm.
// Collectives are blocking: the gather of the next block is not yet overlapped with compute.
#pragma once
#include <algorithm>
#include <cstddef>
#include <map>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/grad_shard.h"
#include "llamatrain/model.h"
#include "llamatrain/param_blocks.h"
#include "llamatrain/zero_plan.h"

namespace lt {

// The host's collectives of ZeRO (zero_plan.h) over lt::Comm (MPI) on host buffers: fp32 weights
// and gradients, the gradients crossing the wire in fp32 or bf16 (--grad-reduce-dtype: each window
// rounded to nearest into a bf16 copy, reduced, and widened back), a window of kCommWindow elements
// per MPI call.
class HostZeroComm final : public ZeroComm {
 public:
  HostZeroComm(Comm& comm, const ShardLayout& shards, DType wire);
  DType wire() const { return wire_; }

 protected:
  void run_reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& what) override;
  void run_gather(size_t begin, size_t end, void* buf, const std::string& what) override;
  double run_norm_sum(double local) override { return comm_.allreduce_sum(local); }

 private:
  Comm& comm_;
  DType wire_;
  std::vector<uint16_t> scratch_;  // bf16: one window
};

// The block calls of Llama2Pass::forward and ::backward (src/model/llama2_pass.h) without their
// compute: what a rank without a micro-batch in a round the others compute runs, so that it joins
// their gathers and reductions in the same order (with zero gradients). For the CPU's ZeroBlocks
// and the device's (src/backend/cuda/device_zero_blocks.h) alike.
template <class P, class G>
void idle_forward_blocks(ParamBlocks<P, G>& z, const ParameterLayout& L) {
  const int head = L.head_block();
  z.acquire(0);
  z.prefetch(std::min(1, head));
  if (!L.tied()) z.release(0);
  for (size_t l = 0; l < L.layers.size(); ++l) {
    const int b = L.layer_block(int(l));
    z.acquire(b);
    z.prefetch(std::min(b + 1, head));
    z.release(b);
  }
  z.acquire(head);
  z.release(head);
  if (L.tied()) z.release(0);
}

template <class P, class G>
void idle_backward_blocks(ParamBlocks<P, G>& z, const ParameterLayout& L) {
  const int head = L.head_block(), n_layers = int(L.layers.size());
  z.acquire(head), z.grads(head);
  if (L.tied()) z.acquire(0), z.grads(0);
  if (n_layers > 0) z.prefetch(L.layer_block(n_layers - 1));
  z.release(head), z.grads_done(head);
  for (int l = n_layers - 1; l >= 0; --l) {
    const int b = L.layer_block(l);
    z.acquire(b);
    if (l > 0) z.prefetch(L.layer_block(l - 1));
    z.grads(b), z.release(b), z.grads_done(b);
  }
  z.grads(0);
  if (L.tied()) z.release(0);
  z.grads_done(0);
}

class ZeroBlocks final : public ParamBlocks<float, float> {
 public:
  // comm: null for one rank. prefetch: stage 3 gathers a block when the pass names it as the next
  // one (ZeroPlanOptions::prefetch) instead of at its acquire.
  ZeroBlocks(HostZeroComm* comm, const ParameterLayout& layout, const ShardLayout& shards, int rank, int stage,
             bool prefetch = false);
  // Where the weights are: the whole flat buffer (stage 2), or this rank's shard, element 0 at
  // flat offset begin(rank) (stage 3); and the rank's shard of the gradient, which grads_done adds
  // to (fp32 or bf16: --grad-reduce-dtype; bf16 also crosses the wire as bf16), or null for a
  // frozen model (LoRA's base: grads() is null and grads_done() does nothing, so the passes
  // compute no gradient of it and only gather). Before the first pass; the buffers must outlive
  // the passes.
  void bind(const float* params, GradShard* shard_grads);

  const float* acquire(int b) override;
  void release(int b) override;
  float* grads(int b) override;
  void grads_done(int b) override;
  void prefetch(int b) override;

  // The most bytes of gathered weights and gradient scratch held at once so far.
  size_t peak_bytes() const { return peak_bytes_; }
  // Seconds spent in this object's collectives so far (waiting for the other ranks included): the
  // trainer takes them out of a micro-batch's compute time, which --balance auto compares.
  double comm_seconds() const { return comm_seconds_; }

 private:
  struct Held {
    std::vector<float> data;
    int users = 0;
  };
  // Block b's weights gathered into a new held buffer (stage 3).
  Held& gather(int b);
  void held_changed();

  HostZeroComm* comm_;
  const ParameterLayout& layout_;
  const ShardLayout& shards_;
  int stage_;
  bool prefetch_;
  size_t own_begin_, own_end_;
  const float* params_ = nullptr;
  GradShard* shard_grads_ = nullptr;
  std::map<int, Held> gathered_;  // stage 3: the weights of the blocks acquired or prefetched
  std::map<int, Held> scratch_;   // the gradients of the blocks in backward
  size_t peak_bytes_ = 0;
  double comm_seconds_ = 0;
};

}  // namespace lt
