// ZeRO stage 3 on the CUDA backend: the parameter blocks (llamatrain/param_blocks.h) of the shared
// forward/backward pass over a rank's shards in device memory, the twin of lt::ZeroBlocks
// (zero_blocks.h) with the same shards and the same collectives in the same order, on device
// buffers (device_comm.h):
//   acquire  all-gathers the block's bf16 weights from every rank's bf16 shard (the optimizer
//            writes this rank's) into a buffer that release frees;
//   grads    fp32 scratch of the block's size, zeroed;
//   grads_done reduces each owner's piece of the scratch to its owner (one NCCL group) and adds
//            this rank's piece to its fp32 gradient shard, then frees the scratch.
// Collectives are blocking (DeviceComm::synchronize after each): the next block's gather is not
// yet issued early. A buffer is freed only after the compute stream has finished with it.
#pragma once
#include <cstddef>
#include <map>
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
  DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank, DeviceComm* comm,
                   cudaStream_t comm_stream);
  // This rank's bf16 weights and fp32 gradient shards (element 0 at flat offset own_begin).
  void bind(const __nv_bfloat16* shard_weights, float* shard_grads);

  const __nv_bfloat16* acquire(int b) override;
  void release(int b) override;
  float* grads(int b) override;
  void grads_done(int b) override;

  // The most bytes of gathered weights and gradient scratch held at once so far.
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  std::vector<size_t> pieces(int b) const;
  void held_changed();

  const ParameterLayout& layout_;
  ShardLayout shards_;
  int rank_;
  size_t own_begin_, own_end_;
  DeviceComm* comm_;
  cudaStream_t comm_stream_;
  const __nv_bfloat16* weights_ = nullptr;
  float* grads_shard_ = nullptr;
  template <class T>
  struct Held {
    DeviceBuffer<T> data;
    int users = 0;
  };
  std::map<int, Held<__nv_bfloat16>> gathered_;
  std::map<int, Held<float>> scratch_;
  size_t peak_bytes_ = 0;
};

LT_CUDA_NAMESPACE_END
