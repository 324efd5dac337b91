// ZeRO stage 3 on the CUDA backend: the parameter blocks (llamatrain/param_blocks.h) of the shared
// forward/backward pass over a rank's shards in device memory, the twin of lt::ZeroBlocks
// (zero_blocks.h) with the same shards and the same collectives in the same order, on device
// buffers (device_comm.h):
//   prefetch all-gathers the block's bf16 weights from every rank's bf16 shard (the optimizer
//            writes this rank's) into a free slot, on the collective stream, and records an event;
//            the pass names the block it will acquire next, so that gather runs under the
//            current block's compute;
//   acquire  the same if the block was not prefetched; the compute stream waits for the block's
//            event (the host does not);
//   release  frees the slot for a later gather (which the collective stream orders after the
//            compute queued before it);
//   grads    fp32 scratch of the block's size, zeroed on the compute stream once the last
//            reduction that read the scratch is done;
//   grads_done reduces each owner's piece of the scratch to its owner (one NCCL group) and adds
//            this rank's piece to its fp32 gradient shard, both on the collective stream.
// Nothing here waits on the host: the slots and scratch buffers are reused (grow-only, allocated in
// the first step), and the host waits for the collectives only in settle() (DeviceZero::settle,
// before a host wait on compute that may depend on them: a lost peer is then reported after
// --comm-timeout instead of hanging the host) and before the step's clipping (DeviceZero).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_comm.h"
#include "llamatrain/model.h"
#include "llamatrain/param_blocks.h"
#include "llamatrain/zero.h"

LT_CUDA_NAMESPACE_BEGIN

class DeviceZeroBlocks final : public ParamBlocks<__nv_bfloat16, float> {
 public:
  // comm: null for one rank (whose shard is the whole model).
  // prefetch: whether prefetch() gathers (train --zero3-prefetch).
  DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank, DeviceComm* comm,
                   cudaStream_t comm_stream, bool prefetch);
  ~DeviceZeroBlocks() override;
  DeviceZeroBlocks(const DeviceZeroBlocks&) = delete;
  DeviceZeroBlocks& operator=(const DeviceZeroBlocks&) = delete;
  // This rank's bf16 weights and fp32 gradient shards (element 0 at flat offset own_begin).
  void bind(const __nv_bfloat16* shard_weights, float* shard_grads);

  const __nv_bfloat16* acquire(int b) override;
  void release(int b) override;
  float* grads(int b) override;
  void grads_done(int b) override;
  void prefetch(int b) override;

  // Collectives issued since the host last waited for them (settled()).
  bool pending() const { return pending_; }
  void settled() { pending_ = false; }
  // The most bytes of gathered weights and gradient scratch allocated at once so far.
  size_t peak_bytes() const { return peak_bytes_; }
  // The ring volume of the gathers and reductions so far (zero_blocks.h).
  const CommVolume& volume() const { return volume_; }

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
  void issued();  // after a group of collectives (DeviceComm::completes_at_issue)
  void held_changed();

  const ParameterLayout& layout_;
  ShardLayout shards_;
  size_t own_begin_, own_end_;
  DeviceComm* comm_;
  cudaStream_t comm_stream_;
  bool prefetch_;
  const __nv_bfloat16* weights_ = nullptr;
  float* grads_shard_ = nullptr;
  std::vector<std::unique_ptr<Slot<__nv_bfloat16>>> gathered_;
  std::vector<std::unique_ptr<Slot<float>>> scratch_;
  bool pending_ = false;
  size_t peak_bytes_ = 0;
  CommVolume volume_;
};

LT_CUDA_NAMESPACE_END
