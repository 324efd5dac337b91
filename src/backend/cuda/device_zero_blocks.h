// ZeRO stages 2 and 3 on the CUDA backend: lt::ShardedBlocks (llamatrain/zero_blocks.h, the logic
// and the collectives the CPU's ZeroBlocks has too) over a rank's shards in device memory, bf16
// weights, the collectives through DeviceZeroComm (below) on the collective stream:
//   a gather (stage 3) all-gathers the block's bf16 weights from every rank's bf16 shard (the
//            optimizer writes this rank's) into a free slot, after the compute queued so far, and
//            records the slot's event; the compute stream waits for it at the first acquire (the
//            host does not). With prefetch the pass names the block it will acquire next, so
//            that gather runs under the current block's compute. Stage 2: every rank holds the
//            whole bf16 working weights; the compute stream waits for the block's all-gather after
//            the last update (DeviceZero's, through the weights_wait hook) and reads it in place;
//   release  frees the slot for a later gather (which the collective stream orders after the
//            compute queued before it);
//   grads    fp32 scratch of the block's size, zeroed on the compute stream once the last
//            reduction that read the scratch is done;
//   grads_done reduces each owner's piece of the scratch to its owner (one NCCL group; with
//            --grad-reduce-dtype bf16 rounded to bf16 first, in windows of a bf16 scratch, and
//            widened back) and adds this rank's piece to its gradient shard, both on the
//            collective stream.
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
#include "llamatrain/zero_blocks.h"

LT_CUDA_NAMESPACE_BEGIN

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

class DeviceZeroBlocks final : public ShardedBlocks<__nv_bfloat16> {
 public:
  struct Options {
    int stage = 3;           // 2: the weights are whole on every rank; 3: only shards
    bool prefetch = true;    // stage 3: whether prefetch() gathers (train --zero3-prefetch)
  };
  // comm: null for one rank (whose shard is the whole model, read in place).
  DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank, DeviceZeroComm* comm,
                   const Options& options);
  ~DeviceZeroBlocks() override;
  DeviceZeroBlocks(const DeviceZeroBlocks&) = delete;
  DeviceZeroBlocks& operator=(const DeviceZeroBlocks&) = delete;
  // The bf16 weights (stage 2: the whole padded working copy, element 0 at flat offset 0; stage 3:
  // this rank's shard, element 0 at own_begin) and this rank's gradient shard (element 0 at
  // own_begin): fp32, or bf16 with --grad-reduce-dtype bf16 (the other pointer null), whose adds
  // round stochastically as lt::GradShard's; both null for a frozen base (LoRA's).
  void bind(const __nv_bfloat16* weights, float* shard_grads, __nv_bfloat16* shard_grads_bf16 = nullptr);
  // Stage 2: what acquire(b) calls before the compute stream reads block b (makes it wait for the
  // block's all-gather after the last update).
  void set_weights_wait(std::function<void(int)> wait) { weights_wait_ = std::move(wait); }

  // Collectives issued since the host last waited for them (settled()).
  bool pending() const { return pending_; }
  void settled() { pending_ = false; }

 protected:
  __nv_bfloat16* hold_weights(int b, size_t n) override { return take(gathered_, b, n).data.data(); }
  void drop_weights(int b) override { find(gathered_, b)->block = -1; }
  float* hold_grads(int b, size_t n) override;
  void drop_grads(int b) override { find(scratch_, b)->block = -1; }
  size_t held_bytes() const override;
  void copy_own(__nv_bfloat16* dst, const __nv_bfloat16* src, size_t n) override;
  void add_own(size_t at, const float* g, size_t n) override;
  bool has_grads() const override { return grads_shard_ || grads_shard_bf16_; }
  void before_collective() override;
  void gathered(int b) override;
  void reading(int b) override;
  void reduced(int b) override;

 private:
  // A buffer reused across blocks: `block` is the one it holds (-1: free), `event` what a reuse
  // waits for (the gather for the compute stream; the reduction for the scratch's next zeroing).
  template <class T>
  struct Slot {
    DeviceBuffer<T> data;
    int block = -1;
    DeviceEvent event = nullptr;
  };
  template <class T>
  static Slot<T>* find(std::vector<std::unique_ptr<Slot<T>>>& slots, int b);
  template <class T>
  static Slot<T>& take(std::vector<std::unique_ptr<Slot<T>>>& slots, int b, size_t n);

  cudaStream_t comm_stream_;
  std::function<void(int)> weights_wait_;
  float* grads_shard_ = nullptr;
  __nv_bfloat16* grads_shard_bf16_ = nullptr;
  uint64_t shard_adds_ = 0;  // adds to the bf16 shard so far: the stochastic rounding's seed
  std::vector<std::unique_ptr<Slot<__nv_bfloat16>>> gathered_;
  std::vector<std::unique_ptr<Slot<float>>> scratch_;
  bool pending_ = false;
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
