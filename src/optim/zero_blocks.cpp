#include "llamatrain/zero_blocks.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "llamatrain/error.h"
#include "llamatrain/safetensors.h"
#include "llamatrain/zero.h"

namespace lt {

using safetensors::bf16_to_f32;
using safetensors::f32_to_bf16;

ZeroBlocks::ZeroBlocks(Comm& comm, const ParameterLayout& layout, const ShardLayout& shards, int stage,
                       CommVolume* volume)
    : comm_(comm),
      layout_(layout),
      shards_(shards),
      stage_(stage),
      own_begin_(shards.begin(comm.rank())),
      own_end_(shards.end(comm.rank())),
      volume_(*volume) {
  LT_CHECK(stage == 2 || stage == 3, "ZeroBlocks: stage ", stage);
}

void ZeroBlocks::bind(const float* params, GradShard* shard_grads) {
  params_ = params;
  shard_grads_ = shard_grads;
}

std::vector<size_t> ZeroBlocks::pieces(int b) const {
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  return shards_.pieces(blk.begin, blk.end);
}

const float* ZeroBlocks::acquire(int b) {
  LT_CHECK(params_, "ZeroBlocks::acquire before bind");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  if (stage_ == 2) return params_ + blk.begin;
  Held& h = gathered_[b];
  if (h.users++ > 0) return h.data.data();
  h.data.assign(blk.size(), 0.f);
  // This rank's piece of the block (if any) from its shard, then every other rank's.
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  if (lo < hi) std::memcpy(h.data.data() + (lo - blk.begin), params_ + (lo - own_begin_), (hi - lo) * sizeof(float));
  if (comm_.size() > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    float* buf = h.data.data();
    for_windows(pieces(b), kCommWindow,
                [&](size_t at, const std::vector<size_t>& n) { comm_.allgather_v(buf + at, n, DType::kF32); });
    volume_.allgather += ring_bytes(4.0 * double(blk.size()), comm_.size());
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  held_changed();
  return h.data.data();
}

void ZeroBlocks::release(int b) {
  if (stage_ == 2) return;
  auto it = gathered_.find(b);
  LT_CHECK(it != gathered_.end() && it->second.users > 0, "ZeroBlocks: block ", b, " released but not acquired");
  if (--it->second.users == 0) gathered_.erase(it);
}

float* ZeroBlocks::grads(int b) {
  if (!shard_grads_) return nullptr;  // a frozen model: no gradients
  Held& h = scratch_[b];
  if (h.users++ == 0) {
    h.data.assign(layout_.blocks[size_t(b)].size(), 0.f);
    held_changed();
  }
  return h.data.data();
}

void ZeroBlocks::grads_done(int b) {
  if (!shard_grads_) return;
  auto it = scratch_.find(b);
  LT_CHECK(it != scratch_.end(), "ZeroBlocks: gradients of block ", b, " done but never written");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  float* g = it->second.data.data();
  // This rank's piece of the block: [lo, hi) of the flat buffer.
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  const bool bf16 = shard_grads_->dtype() == DType::kBF16;
  if (comm_.size() == 1) {
    if (lo < hi) shard_grads_->add(lo - own_begin_, g + (lo - blk.begin), hi - lo);
  } else if (!bf16) {
    const auto t0 = std::chrono::steady_clock::now();
    for_windows(pieces(b), kCommWindow,
                [&](size_t at, const std::vector<size_t>& n) { comm_.reduce_scatter_v_sum(g + at, n, DType::kF32); });
    volume_.reduce_scatter += ring_bytes(4.0 * double(blk.size()), comm_.size());
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (lo < hi) shard_grads_->add(lo - own_begin_, g + (lo - blk.begin), hi - lo);
  } else {
    // bf16 on the wire, a window at a time; this rank's part of each window goes to the shard.
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<uint16_t> wire;
    for_windows(pieces(b), kCommWindow, [&](size_t at, const std::vector<size_t>& n) {
      size_t m = 0;
      for (size_t c : n) m += c;
      wire.resize(m);
      for (size_t i = 0; i < m; ++i) wire[i] = f32_to_bf16(g[at + i]);
      comm_.reduce_scatter_v_sum(wire.data(), n, DType::kBF16);
      const size_t w0 = std::max(lo, blk.begin + at), w1 = std::min(hi, blk.begin + at + m);
      if (w0 < w1) shard_grads_->add_bf16(w0 - own_begin_, wire.data() + (w0 - blk.begin - at), w1 - w0);
    });
    volume_.reduce_scatter += ring_bytes(2.0 * double(blk.size()), comm_.size());
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  scratch_.erase(it);
}

void ZeroBlocks::held_changed() {
  size_t bytes = 0;
  for (const auto& [b, h] : gathered_) bytes += h.data.size() * sizeof(float);
  for (const auto& [b, h] : scratch_) bytes += h.data.size() * sizeof(float);
  peak_bytes_ = std::max(peak_bytes_, bytes);
}

}  // namespace lt
