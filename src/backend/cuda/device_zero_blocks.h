// ZeRO stages 2 and 3 on the CUDA backend: the parameter blocks (llamatrain/param_blocks.h) of the
// shared forward/backward pass over a rank's shards in device memory, the twin of lt::ZeroBlocks
// (zero_blocks.h) with the same shards and the collectives of the same ZeRO plan in its order
// (llamatrain/zero_plan.h; tests/mpi/test_zero_plan_mpi.cpp checks it), on device buffers through
// DeviceZeroComm (below):
//   prefetch (stage 3) all-gathers the block's bf16 weights from every rank's bf16 shard (the
//            optimizer writes this rank's) into a free slot, on the collective stream, and records
//            an event; the pass names the block it will acquire next, so that gather runs under
//            the current block's compute;
//   acquire  stage 3: the same if the block was not prefetched; the compute stream waits for the
//            block's event (the host does not). Stage 2: every rank holds the whole bf16 working
//            weights; the compute stream waits for the block's all-gather after the last update
//            (DeviceZero's, through the weights_wait hook) and reads the block in place;
//   release  frees the slot for a later gather (which the collective stream orders after the
//            compute queued before it);
//   grads    fp32 scratch of the block's size, zeroed on the compute stream once the last
//            reduction that read the scratch is done;
//   grads_done reduces each owner's piece of the scratch to its owner (one NCCL group; with
//            --grad-reduce-dtype bf16 rounded to bf16 first, in windows of a bf16 scratch, and
//            widened back) and adds this rank's piece to its fp32 gradient shard, both on the
//            collective stream. Every micro-batch: the gradients are never held whole (true ZeRO 2,
//            as DeepSpeed's), at the price of a reduction per micro-batch instead of one per step.
// Nothing here waits on the host: the slots and scratch buffers are reused (grow-only, allocated in
// the first step), and the host waits for the collectives only in settle() (DeviceZero::settle,
// before a host wait on compute that may depend on them: a lost peer is then reported after
// --comm-timeout instead of hanging the host) and before the step's clipping (DeviceZero).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_comm.h"
#include "llamatrain/device.h"
#include "llamatrain/model.h"
#include "llamatrain/param_blocks.h"
#include "llamatrain/zero.h"

LT_CUDA_NAMESPACE_BEGIN

// "the embedding", "layer 3", "the final norm and output head": block b in fault reports.
std::string parameter_block_name(const ParameterLayout& layout, int b);

// The device's collectives of ZeRO (llamatrain/zero_plan.h) on device buffers, through its DeviceComm
// (NCCL, or the simulator's MPI), queued on the collective stream: bf16 weights; fp32 gradients,
// which cross the wire in fp32 or, with --grad-reduce-dtype bf16, in windows rounded into a bf16
// scratch on the collective stream, reduced and widened back (all of the window for an
// all-reduce, this rank's piece for a reduce-scatter). A reduce-scatter over [b, e) is each owner's
// piece reduced to its owner, in one NCCL group (the pieces are uneven, which ncclReduceScatter is
// not). The caller orders the collective stream after the compute that wrote the buffers.
class DeviceZeroComm final : public ZeroComm {
 public:
  // device: the ranks' device communicator, queued on `stream`; host: theirs on the host (the
  // norm's sum). wire_elems: the most elements one reduction covers (the bf16 scratch's size,
  // capped at kWireWindow).
  DeviceZeroComm(std::unique_ptr<DeviceComm> device, Comm& host, const ShardLayout& shards, cudaStream_t stream,
                 bool wire_bf16, size_t wire_elems);
  DeviceComm& device() { return *device_; }
  cudaStream_t stream() const { return stream_; }
  bool wire_bf16() const { return wire_bf16_; }

 protected:
  void run_reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& what) override;
  void run_gather(size_t begin, size_t end, void* buf, const std::string& what) override;
  double run_norm_sum(double local) override { return host_.allreduce_sum(local); }

 private:
  // [b, e) of buf (element 0 at flat offset b), in T, summed with the shards' boundaries or whole.
  template <class T>
  void sum(ZeroOp op, T* buf, size_t b, size_t e, const std::string& what);
  // The most elements one bf16 reduction carries (64 MiB of scratch), so that a 7B layer does not
  // need a bf16 copy of its own size.
  static constexpr size_t kWireWindow = size_t(1) << 25;
  std::unique_ptr<DeviceComm> device_;
  Comm& host_;
  cudaStream_t stream_;
  bool wire_bf16_;
  DeviceBuffer<__nv_bfloat16> wire_;
};

class DeviceZeroBlocks final : public ParamBlocks<__nv_bfloat16, float> {
 public:
  struct Options {
    int stage = 3;           // 2: the weights are whole on every rank; 3: only shards
    bool prefetch = true;    // stage 3: whether prefetch() gathers (train --zero3-prefetch)
  };
  // comm: null for one rank (whose shard is the whole model).
  DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank, DeviceZeroComm* comm,
                   const Options& options);
  ~DeviceZeroBlocks() override;
  DeviceZeroBlocks(const DeviceZeroBlocks&) = delete;
  DeviceZeroBlocks& operator=(const DeviceZeroBlocks&) = delete;
  // The bf16 weights (stage 2: the whole padded working copy, element 0 at flat offset 0; stage 3:
  // this rank's shard, element 0 at own_begin) and this rank's gradient shard (element 0 at
  // own_begin): fp32, or bf16 with --grad-reduce-dtype bf16 (the other pointer null), whose adds
  // round stochastically as lt::GradShard's; both null for a frozen base (LoRA's: grads() gives
  // null, the pass computes no gradient of it, and grads_done() does nothing).
  void bind(const __nv_bfloat16* weights, float* shard_grads, __nv_bfloat16* shard_grads_bf16 = nullptr);
  // Stage 2: what acquire(b) calls before the compute stream reads block b (makes it wait for the
  // block's all-gather after the last update).
  void set_weights_wait(std::function<void(int)> wait) { weights_wait_ = std::move(wait); }
  const __nv_bfloat16* acquire(int b) override;
  void release(int b) override;
  float* grads(int b) override;
  void grads_done(int b) override;
  void prefetch(int b) override;

  // Collectives issued since the host last waited for them (settled()).
  bool pending() const { return pending_; }
  // Bound without a gradient shard: a frozen base.
  bool frozen() const { return !grads_shard_ && !grads_shard_bf16_; }
  void settled() { pending_ = false; }
  // The most bytes of gathered weights and gradient scratch allocated at once so far.
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  // A buffer reused across blocks: `block` is the one it holds (-1: free), `users` its holders,
  // `event` what a reuse waits for (the gather for the compute stream; the reduction for the
  // scratch's next zeroing).
  template <class T>
  struct Slot {
    DeviceBuffer<T> data;
    int block = -1;
    int users = 0;
    DeviceEvent event = nullptr;
  };
  template <class T>
  static Slot<T>* find(std::vector<std::unique_ptr<Slot<T>>>& slots, int b);
  template <class T>
  Slot<T>& take(std::vector<std::unique_ptr<Slot<T>>>& slots, int b);
  Slot<__nv_bfloat16>& gather(int b);
  void issued();  // after a block's collectives and the work queued behind them: settle() waits for them
  void held_changed();

  const ParameterLayout& layout_;
  ShardLayout shards_;
  size_t own_begin_, own_end_;
  DeviceZeroComm* comm_;
  cudaStream_t comm_stream_;
  Options options_;
  std::function<void(int)> weights_wait_;
  const __nv_bfloat16* weights_ = nullptr;
  float* grads_shard_ = nullptr;
  __nv_bfloat16* grads_shard_bf16_ = nullptr;
  uint64_t shard_adds_ = 0;  // adds to the bf16 shard so far: the stochastic rounding's seed
  std::vector<std::unique_ptr<Slot<__nv_bfloat16>>> gathered_;
  std::vector<std::unique_ptr<Slot<float>>> scratch_;
  bool pending_ = false;
  size_t peak_bytes_ = 0;
};

// LoRA at ZeRO 3 on the device, the twin of lt::FrozenShards (zero.h): the frozen base as this rank's
// bf16 shard, which blocks() gathers a block at a time for the passes (on its own collective stream
// and device communicator over the host's), computing no gradient of it.
class DeviceFrozenShards {
 public:
  DeviceFrozenShards(const ParameterLayout& layout, const ShardLayout& shards, Comm& comm,
                     const DeviceCollectives& collectives);
  ~DeviceFrozenShards();
  DeviceFrozenShards(const DeviceFrozenShards&) = delete;
  DeviceFrozenShards& operator=(const DeviceFrozenShards&) = delete;
  // This rank's shard of the base (fp32 host, element 0 at its flat begin), rounded to bf16.
  void load(const float* own);
  DeviceZeroBlocks& blocks() { return *blocks_; }
  // The host waits for the gathers issued so far (the host-wait rule, device.h).
  void settle();
  void set_step(int64_t step) {
    if (comm_) comm_->set_step(step);
  }
  CommVolume volume() const { return comm_ ? comm_->volume() : CommVolume{}; }

 private:
  cudaStream_t stream_ = nullptr;          // null for one rank
  std::unique_ptr<DeviceZeroComm> comm_;  // null for one rank
  DeviceBuffer<__nv_bfloat16> shard_;
  size_t own_ = 0;                      // this rank's real elements
  std::unique_ptr<DeviceZeroBlocks> blocks_;
};

LT_CUDA_NAMESPACE_END
