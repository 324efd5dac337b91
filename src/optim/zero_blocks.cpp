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

HostZeroComm::HostZeroComm(Comm& comm, const ShardLayout& shards, DType wire)
    : ZeroComm(shards, comm.rank()), comm_(comm), wire_(wire) {
  LT_CHECK(wire == DType::kF32 || wire == DType::kBF16, "gradient reduction dtype ", dtype_name(wire));
}

void HostZeroComm::run_reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& /*what*/) {
  const bool scatter = op == ZeroOp::kReduceScatter;
  const bool bf16 = wire_ == DType::kBF16;
  const std::vector<size_t> pieces = scatter ? shards_.pieces(begin, end) : std::vector<size_t>{end - begin};
  for_windows(pieces, kCommWindow, [&](size_t at, const std::vector<size_t>& n) {
    size_t m = 0;
    for (size_t c : n) m += c;
    float* w = buf + at;
    if (!bf16) {
      if (scatter) comm_.reduce_scatter_v_sum(w, n, DType::kF32);
      else comm_.allreduce_sum(w, m, DType::kF32);
      return;
    }
    scratch_.resize(m);
    for (size_t i = 0; i < m; ++i) scratch_[i] = f32_to_bf16(w[i]);
    if (scatter) comm_.reduce_scatter_v_sum(scratch_.data(), n, DType::kBF16);
    else comm_.allreduce_sum(scratch_.data(), m, DType::kBF16);
    for (size_t i = 0; i < m; ++i) w[i] = bf16_to_f32(scratch_[i]);
  });
  const double bytes = double(dtype_size(wire_)) * double(end - begin);
  if (scatter) volume_.reduce_scatter += ring_bytes(bytes, shards_.world);
  else volume_.allreduce += 2 * ring_bytes(bytes, shards_.world);
}

void HostZeroComm::run_gather(size_t begin, size_t end, void* buf, const std::string& /*what*/) {
  auto* p = static_cast<float*>(buf);
  for_windows(shards_.pieces(begin, end), kCommWindow,
              [&](size_t at, const std::vector<size_t>& n) { comm_.allgather_v(p + at, n, DType::kF32); });
  volume_.allgather += ring_bytes(4.0 * double(end - begin), shards_.world);
}

ZeroBlocks::ZeroBlocks(HostZeroComm* comm, const ParameterLayout& layout, const ShardLayout& shards, int rank,
                       int stage, bool prefetch)
    : comm_(comm),
      layout_(layout),
      shards_(shards),
      stage_(stage),
      prefetch_(prefetch),
      own_begin_(shards.begin(rank)),
      own_end_(shards.end(rank)) {
  LT_CHECK(stage == 2 || stage == 3, "ZeroBlocks: stage ", stage);
}

void ZeroBlocks::bind(const float* params, GradShard* shard_grads) {
  params_ = params;
  shard_grads_ = shard_grads;
}

ZeroBlocks::Held& ZeroBlocks::gather(int b) {
  LT_CHECK(params_, "ZeroBlocks: a gather before bind");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  Held& h = gathered_[b];
  h.data.assign(blk.size(), 0.f);
  // This rank's piece of the block (if any) from its shard, then every other rank's.
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  if (lo < hi) std::memcpy(h.data.data() + (lo - blk.begin), params_ + (lo - own_begin_), (hi - lo) * sizeof(float));
  if (comm_) {
    const auto t0 = std::chrono::steady_clock::now();
    comm_->gather(blk.begin, blk.end, h.data.data(), "ZeRO-3 weights");
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  held_changed();
  return h;
}

void ZeroBlocks::prefetch(int b) {
  if (stage_ == 3 && prefetch_ && comm_ && !gathered_.count(b)) gather(b);
}

const float* ZeroBlocks::acquire(int b) {
  LT_CHECK(params_, "ZeroBlocks::acquire before bind");
  if (stage_ == 2) return params_ + layout_.blocks[size_t(b)].begin;
  auto it = gathered_.find(b);
  Held& h = it != gathered_.end() ? it->second : gather(b);
  ++h.users;
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
  if (comm_) {
    const auto t0 = std::chrono::steady_clock::now();
    comm_->reduce(ZeroOp::kReduceScatter, blk.begin, blk.end, g, "gradients");
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // This rank's piece of the block, [lo, hi) of the flat buffer, summed over the ranks (the values
  // a bf16 wire delivered, widened: a bf16 shard adds them exactly as it would the bf16 bits).
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  if (lo < hi) shard_grads_->add(lo - own_begin_, g + (lo - blk.begin), hi - lo);
  scratch_.erase(it);
}

void ZeroBlocks::held_changed() {
  size_t bytes = 0;
  for (const auto& [b, h] : gathered_) bytes += h.data.size() * sizeof(float);
  for (const auto& [b, h] : scratch_) bytes += h.data.size() * sizeof(float);
  peak_bytes_ = std::max(peak_bytes_, bytes);
}

}  // namespace lt
