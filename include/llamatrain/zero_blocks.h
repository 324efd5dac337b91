// ZeRO stages 2 and 3's parameter blocks (param_blocks.h), written once for both engines:
// ShardedBlocks below has the calls, their order and the collectives; the CPU's ZeroBlocks (fp32
// weights in host memory) and the device's DeviceZeroBlocks (src/backend/cuda/device_zero_blocks.h:
// bf16 weights in device memory, the collectives queued on a stream) give it memory, and the device
// its stream ordering. The shards are the plan's (zero_plan.h): rank r owns [begin(r), end(r)) of
// the flat buffer, the same cut in every stage, so a checkpoint of any stage loads in any other. A
// block (the embeddings, a layer, the head) overlaps one or more shards; its piece in rank r's
// shard is what rank r contributes to and receives of it.
//  stage 2  every rank holds all the weights (acquire is the block's range of them); gradients
//           go to scratch of one block, which grads_done reduce-scatters, adds this rank's piece
//           of to its gradient shard and frees: no full-size gradient buffer, a reduction per
//           micro-batch and block (as DeepSpeed's ZeRO-2).
//  stage 3  as stage 2 for gradients, and the weights too are only the rank's shard: acquire (or
//           prefetch, where the plan says so) all-gathers the block into a buffer that the last
//           release frees.
// The collectives go through a ZeroComm (zero_plan.h): HostZeroComm's block the CPU, and its
// gather is not yet overlapped with compute; the device's run on its collective stream.
#pragma once
#include <algorithm>
#include <cstddef>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/error.h"
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

// "the embedding", "layer 3", "the final norm and output head": block b in fault reports.
std::string parameter_block_name(const ParameterLayout& layout, int b);

// W: the weights' element type (float on the CPU, bf16 on a device); gradients are fp32.
template <class W>
class ShardedBlocks : public ParamBlocks<W, float> {
 public:
  // comm: null for one rank, whose stage 3 gathers each block from its shard all the same (the
  // CPU: its memory table counts the gathered blocks at every rank count) or, with
  // one_rank_in_place, reads the shard (the whole model) in place (a device:
  // device_gathered_weight_bytes). prefetch: stage 3 gathers a block when the pass names it as the
  // next one (ZeroPlanOptions::prefetch) instead of at its acquire.
  ShardedBlocks(ZeroComm* comm, const ParameterLayout& layout, const ShardLayout& shards, int rank, int stage,
                bool prefetch, bool one_rank_in_place)
      : comm_(comm),
        layout_(layout),
        stage_(stage),
        prefetch_(prefetch),
        in_place_(one_rank_in_place && !comm),
        own_begin_(shards.begin(rank)),
        own_end_(shards.end(rank)) {
    LT_CHECK(stage == 2 || stage == 3, "ZeRO blocks at stage ", stage, " (2 or 3)");
  }

  const W* acquire(int b) override {
    LT_CHECK(weights_, "ZeRO blocks: acquire before bind");
    if (stage_ == 2 || in_place_) {
      if (stage_ == 2) reading(b);
      return weights_ + layout_.blocks[size_t(b)].begin;
    }
    auto it = gathered_.find(b);
    Held<W>& h = it != gathered_.end() ? it->second : gather(b);
    if (h.users++ == 0) reading(b);
    return h.data;
  }
  void release(int b) override {
    if (stage_ == 2 || in_place_) return;
    auto it = gathered_.find(b);
    LT_CHECK(it != gathered_.end() && it->second.users > 0, "ZeRO blocks: block ", b, " released but not acquired");
    if (--it->second.users > 0) return;
    drop_weights(b);
    gathered_.erase(it);
  }
  float* grads(int b) override {
    if (!has_grads()) return nullptr;  // a frozen model: no gradients
    Held<float>& h = scratch_[b];
    if (h.users++ == 0) {
      h.data = hold_grads(b, layout_.blocks[size_t(b)].size());
      held_changed();
    }
    return h.data;
  }
  void grads_done(int b) override {
    if (!has_grads()) return;
    auto it = scratch_.find(b);
    LT_CHECK(it != scratch_.end(), "ZeRO blocks: gradients of block ", b, " done but never written");
    const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
    float* g = it->second.data;
    if (comm_) {
      before_collective();
      timed([&] { comm_->reduce(ZeroOp::kReduceScatter, blk.begin, blk.end, g, "gradients of " + name(b)); });
    }
    // This rank's piece of the block, [lo, hi) of the flat buffer, summed over the ranks.
    const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
    if (lo < hi) add_own(lo - own_begin_, g + (lo - blk.begin), hi - lo);
    reduced(b);
    drop_grads(b);
    scratch_.erase(it);
  }
  void prefetch(int b) override {
    if (stage_ == 3 && prefetch_ && comm_ && !gathered_.count(b)) gather(b);
  }

  // The most bytes of gathered weights and gradient scratch held at once so far.
  size_t peak_bytes() const { return peak_bytes_; }
  // Seconds spent in this object's collectives so far (on the CPU, waiting for the other ranks
  // included): the trainer takes them out of a micro-batch's compute time, which --balance auto
  // compares.
  double comm_seconds() const { return comm_seconds_; }

 protected:
  // The engine's memory: a buffer of n weights for block b's gather, until no acquire holds it;
  // n zeroed gradients for block b's scratch, until its grads_done; the bytes of both held now.
  virtual W* hold_weights(int b, size_t n) = 0;
  virtual void drop_weights(int b) = 0;
  virtual float* hold_grads(int b, size_t n) = 0;
  virtual void drop_grads(int b) = 0;
  virtual size_t held_bytes() const = 0;
  // n weights of this rank's shard into a block's gather buffer (before the gather); n summed
  // gradients into the rank's gradient shard at `at` (after the reduction).
  virtual void copy_own(W* dst, const W* src, size_t n) = 0;
  virtual void add_own(size_t at, const float* g, size_t n) = 0;
  // A gradient shard is bound: none for a frozen model (LoRA's base: grads() is null and
  // grads_done() does nothing, so the passes compute no gradient of it and only gather).
  virtual bool has_grads() const = 0;
  // The order of an engine that queues its work on streams (nothing on the CPU): the collectives
  // follow the compute queued so far; block b's gather was issued; the pass reads block b's
  // weights from here on (stage 2 every acquire, stage 3 the first); block b's gradients were
  // reduced and added.
  virtual void before_collective() {}
  virtual void gathered(int /*b*/) {}
  virtual void reading(int /*b*/) {}
  virtual void reduced(int /*b*/) {}

  ZeroComm* comm_;
  const ParameterLayout& layout_;
  int stage_;
  bool prefetch_, in_place_;
  size_t own_begin_, own_end_;
  // Stage 2: the whole flat working weights; stage 3: this rank's shard, element 0 at own_begin_.
  const W* weights_ = nullptr;

 private:
  template <class T>
  struct Held {
    T* data = nullptr;
    int users = 0;
  };
  std::string name(int b) const { return parameter_block_name(layout_, b); }
  template <class F>
  void timed(F&& collective) {
    const auto t0 = std::chrono::steady_clock::now();
    collective();
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Block b's weights gathered into a new buffer: this rank's piece from its shard, then every
  // other rank's.
  Held<W>& gather(int b) {
    LT_CHECK(weights_, "ZeRO blocks: a gather before bind");
    const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
    Held<W>& h = gathered_[b];
    h.data = hold_weights(b, blk.size());
    held_changed();
    before_collective();
    const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
    if (lo < hi) copy_own(h.data + (lo - blk.begin), weights_ + (lo - own_begin_), hi - lo);
    if (comm_) timed([&] { comm_->gather(blk.begin, blk.end, h.data, "ZeRO-3 weights of " + name(b)); });
    gathered(b);
    return h;
  }
  void held_changed() { peak_bytes_ = std::max(peak_bytes_, held_bytes()); }

  std::map<int, Held<W>> gathered_;    // stage 3: the blocks acquired or prefetched
  std::map<int, Held<float>> scratch_;  // the gradients of the blocks in backward
  size_t peak_bytes_ = 0;
  double comm_seconds_ = 0;
};

// The CPU's: fp32 weights, each gathered block and scratch a buffer of its own, freed after use.
class ZeroBlocks final : public ShardedBlocks<float> {
 public:
  // comm: null for one rank.
  ZeroBlocks(HostZeroComm* comm, const ParameterLayout& layout, const ShardLayout& shards, int rank, int stage,
             bool prefetch = false)
      : ShardedBlocks(comm, layout, shards, rank, stage, prefetch, false) {}
  // Where the weights are: the whole flat buffer (stage 2), or this rank's shard, element 0 at
  // flat offset begin(rank) (stage 3); and the rank's shard of the gradient, which grads_done adds
  // to (fp32 or bf16: --grad-reduce-dtype; bf16 also crosses the wire as bf16, and the shard adds
  // the values it delivered, widened, exactly as it would the bf16 bits), or null for a frozen
  // model. Before the first pass; the buffers must outlive the passes.
  void bind(const float* params, GradShard* shard_grads) {
    weights_ = params;
    shard_grads_ = shard_grads;
  }

 protected:
  float* hold_weights(int b, size_t n) override { return hold(weights_held_, b, n); }
  void drop_weights(int b) override { weights_held_.erase(b); }
  float* hold_grads(int b, size_t n) override { return hold(grads_held_, b, n); }
  void drop_grads(int b) override { grads_held_.erase(b); }
  size_t held_bytes() const override;
  void copy_own(float* dst, const float* src, size_t n) override { std::copy(src, src + n, dst); }
  void add_own(size_t at, const float* g, size_t n) override { shard_grads_->add(at, g, n); }
  bool has_grads() const override { return shard_grads_ != nullptr; }

 private:
  static float* hold(std::map<int, std::vector<float>>& held, int b, size_t n) {
    std::vector<float>& v = held[b];
    v.assign(n, 0.f);
    return v.data();
  }
  GradShard* shard_grads_ = nullptr;
  std::map<int, std::vector<float>> weights_held_, grads_held_;
};

}  // namespace lt
