// ZeRO stage 3's parameter blocks on the device (see device_zero_blocks.h). Compiled in both builds.
#include "backend/cuda/device_zero_blocks.h"

#include <algorithm>

#include "llamatrain/error.h"
#include "llamatrain/zero_blocks.h"
#include "optimizer.cuh"

LT_CUDA_NAMESPACE_BEGIN

DeviceZeroBlocks::DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank,
                                   DeviceComm* comm, cudaStream_t comm_stream)
    : layout_(layout),
      shards_(shards),
      rank_(rank),
      own_begin_(shards.begin(rank)),
      own_end_(shards.end(rank)),
      comm_(comm),
      comm_stream_(comm_stream) {}

void DeviceZeroBlocks::bind(const __nv_bfloat16* shard_weights, float* shard_grads) {
  weights_ = shard_weights;
  grads_shard_ = shard_grads;
}

std::vector<size_t> DeviceZeroBlocks::pieces(int b) const {
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  return shards_.pieces(blk.begin, blk.end);
}

const __nv_bfloat16* DeviceZeroBlocks::acquire(int b) {
  LT_CHECK(weights_, "DeviceZeroBlocks::acquire before bind");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  if (!comm_) return weights_ + blk.begin;  // one rank: its shard is the whole model
  Held<__nv_bfloat16>& h = gathered_[b];
  if (h.users++ > 0) return h.data.data();
  h.data.resize(blk.size());
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  if (lo < hi) copy_on_device(h.data.data() + (lo - blk.begin), weights_ + (lo - own_begin_), (hi - lo) * 2, nullptr);
  // The gather waits for the copy (and for the optimizer's writes to the shard before it).
  stream_wait(comm_stream_, nullptr);
  comm_->set_context(strcat("ZeRO-3 weights of block ", b));
  __nv_bfloat16* buf = h.data.data();
  for_windows(pieces(b), kCommWindow, [&](size_t at, const std::vector<size_t>& n) { comm_->allgather_v(buf + at, n); });
  comm_->synchronize();
  held_changed();
  return buf;
}

void DeviceZeroBlocks::release(int b) {
  if (!comm_) return;
  auto it = gathered_.find(b);
  LT_CHECK(it != gathered_.end() && it->second.users > 0, "DeviceZeroBlocks: block ", b, " released but not acquired");
  if (--it->second.users > 0) return;
  stream_synchronize(nullptr);  // the kernels that read it have run
  gathered_.erase(it);
}

float* DeviceZeroBlocks::grads(int b) {
  Held<float>& h = scratch_[b];
  if (h.users++ == 0) {
    h.data.resize(layout_.blocks[size_t(b)].size());
    device_memset(h.data.data(), 0, h.data.size() * sizeof(float));
    held_changed();
  }
  return h.data.data();
}

void DeviceZeroBlocks::grads_done(int b) {
  LT_CHECK(grads_shard_, "DeviceZeroBlocks::grads_done before bind");
  auto it = scratch_.find(b);
  LT_CHECK(it != scratch_.end(), "DeviceZeroBlocks: gradients of block ", b, " done but never written");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  float* g = it->second.data.data();
  if (comm_) {
    // Each owner's piece to its owner, after the backward work that wrote the scratch.
    stream_wait(comm_stream_, nullptr);
    const std::vector<size_t> n = pieces(b);
    comm_->set_context(strcat("ZeRO-3 gradients of block ", b));
    comm_->group_begin();
    size_t at = 0;
    for (int r = 0; r < shards_.world; ++r) {
      if (n[size_t(r)] > 0) comm_->reduce_sum(g + at, n[size_t(r)], r);
      at += n[size_t(r)];
    }
    comm_->group_end();
    comm_->synchronize();
  }
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  if (lo < hi) add_inplace_cuda(grads_shard_ + (lo - own_begin_), g + (lo - blk.begin), hi - lo, nullptr);
  stream_synchronize(nullptr);  // the add has read the scratch
  scratch_.erase(it);
}

void DeviceZeroBlocks::held_changed() {
  size_t bytes = 0;
  for (const auto& [b, h] : gathered_) bytes += h.data.size() * sizeof(__nv_bfloat16);
  for (const auto& [b, h] : scratch_) bytes += h.data.size() * sizeof(float);
  peak_bytes_ = std::max(peak_bytes_, bytes);
}

LT_CUDA_NAMESPACE_END
