// ZeRO stage 3's parameter blocks on the device (see device_zero_blocks.h). Compiled in both builds.
#include "backend/cuda/device_zero_blocks.h"

#include <algorithm>

#include "llamatrain/error.h"
#include "llamatrain/zero_blocks.h"
#include "optimizer.cuh"

LT_CUDA_NAMESPACE_BEGIN

DeviceZeroBlocks::DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank,
                                   DeviceComm* comm, cudaStream_t comm_stream, bool prefetch)
    : layout_(layout),
      shards_(shards),
      own_begin_(shards.begin(rank)),
      own_end_(shards.end(rank)),
      comm_(comm),
      comm_stream_(comm_stream),
      prefetch_(prefetch) {}

DeviceZeroBlocks::~DeviceZeroBlocks() {
  for (auto& s : gathered_) event_destroy(s->event);
  for (auto& s : scratch_) event_destroy(s->event);
}

void DeviceZeroBlocks::bind(const __nv_bfloat16* shard_weights, float* shard_grads) {
  weights_ = shard_weights;
  grads_shard_ = shard_grads;
}

template <class T>
DeviceZeroBlocks::Slot<T>* DeviceZeroBlocks::find(std::vector<std::unique_ptr<Slot<T>>>& slots, int b) {
  for (auto& s : slots)
    if (s->block == b) return s.get();
  return nullptr;
}

// A free slot for block b, sized for it: the smallest free one large enough, else the largest free
// one grown, else a new one. The same calls pick the same slots every step, so only the first
// steps allocate.
template <class T>
DeviceZeroBlocks::Slot<T>& DeviceZeroBlocks::take(std::vector<std::unique_ptr<Slot<T>>>& slots, int b) {
  const size_t n = layout_.blocks[size_t(b)].size();
  Slot<T>* fit = nullptr;
  Slot<T>* largest = nullptr;
  for (auto& s : slots) {
    if (s->block >= 0) continue;
    const size_t cap = s->data.capacity();
    if (cap >= n && (!fit || cap < fit->data.capacity())) fit = s.get();
    if (!largest || cap > largest->data.capacity()) largest = s.get();
  }
  Slot<T>* pick = fit ? fit : largest;
  if (!pick) {
    slots.push_back(std::make_unique<Slot<T>>());
    pick = slots.back().get();
    pick->event = event_create();
  }
  pick->data.resize(n);
  pick->block = b;
  pick->users = 0;
  held_changed();
  return *pick;
}

DeviceZeroBlocks::Slot<__nv_bfloat16>& DeviceZeroBlocks::gather(int b) {
  Slot<__nv_bfloat16>& s = take(gathered_, b);
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  __nv_bfloat16* buf = s.data.data();
  // After the compute queued so far: the optimizer's writes to the shard, and the last reads of
  // what this slot held before.
  stream_wait(comm_stream_, nullptr);
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  if (lo < hi) copy_on_device(buf + (lo - blk.begin), weights_ + (lo - own_begin_), (hi - lo) * 2, comm_stream_);
  comm_->set_context(strcat("ZeRO-3 weights of block ", b));
  for_windows(shards_.pieces(blk.begin, blk.end), kCommWindow,
              [&](size_t at, const std::vector<size_t>& n) { comm_->allgather_v(buf + at, n); });
  event_record(s.event, comm_stream_);
  volume_.allgather += ring_bytes(2.0 * double(blk.size()), shards_.world);
  issued();
  return s;
}

void DeviceZeroBlocks::prefetch(int b) {
  if (prefetch_ && comm_ && !find(gathered_, b)) gather(b);
}

const __nv_bfloat16* DeviceZeroBlocks::acquire(int b) {
  LT_CHECK(weights_, "DeviceZeroBlocks::acquire before bind");
  if (!comm_) return weights_ + layout_.blocks[size_t(b)].begin;  // one rank: its shard is the whole model
  Slot<__nv_bfloat16>* s = find(gathered_, b);
  if (!s) s = &gather(b);
  if (s->users++ == 0) stream_wait_event(nullptr, s->event);  // the compute stream waits; the host does not
  return s->data.data();
}

void DeviceZeroBlocks::release(int b) {
  if (!comm_) return;
  Slot<__nv_bfloat16>* s = find(gathered_, b);
  LT_CHECK(s && s->users > 0, "DeviceZeroBlocks: block ", b, " released but not acquired");
  if (--s->users == 0) s->block = -1;  // a later gather orders itself after the reads queued so far
}

float* DeviceZeroBlocks::grads(int b) {
  if (Slot<float>* s = find(scratch_, b)) {
    ++s->users;
    return s->data.data();
  }
  Slot<float>& s = take(scratch_, b);
  s.users = 1;
  stream_wait_event(nullptr, s.event);  // the last reduction that read this scratch is done
  device_memset(s.data.data(), 0, s.data.size() * sizeof(float));
  return s.data.data();
}

void DeviceZeroBlocks::grads_done(int b) {
  LT_CHECK(grads_shard_, "DeviceZeroBlocks::grads_done before bind");
  Slot<float>* s = find(scratch_, b);
  LT_CHECK(s, "DeviceZeroBlocks: gradients of block ", b, " done but never written");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  float* g = s->data.data();
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  cudaStream_t add_on = nullptr;
  if (comm_) {
    // Each owner's piece to its owner, after the backward work that wrote the scratch.
    stream_wait(comm_stream_, nullptr);
    const std::vector<size_t> n = shards_.pieces(blk.begin, blk.end);
    comm_->set_context(strcat("ZeRO-3 gradients of block ", b));
    comm_->group_begin();
    size_t at = 0;
    for (int r = 0; r < shards_.world; ++r) {
      if (n[size_t(r)] > 0) comm_->reduce_sum(g + at, n[size_t(r)], r);
      at += n[size_t(r)];
    }
    comm_->group_end();
    volume_.reduce_scatter += ring_bytes(4.0 * double(blk.size()), shards_.world);
    issued();
    add_on = comm_stream_;
  }
  if (lo < hi) add_inplace_cuda(grads_shard_ + (lo - own_begin_), g + (lo - blk.begin), hi - lo, add_on);
  event_record(s->event, add_on);
  s->block = -1;
  s->users = 0;
}

void DeviceZeroBlocks::issued() {
  pending_ = true;
  if (comm_->completes_at_issue()) {  // the simulator: find a fault before the next host collective
    comm_->synchronize();
    pending_ = false;
  }
}

void DeviceZeroBlocks::held_changed() {
  size_t bytes = 0;
  for (const auto& s : gathered_) bytes += s->data.capacity() * sizeof(__nv_bfloat16);
  for (const auto& s : scratch_) bytes += s->data.capacity() * sizeof(float);
  peak_bytes_ = std::max(peak_bytes_, bytes);
}

LT_CUDA_NAMESPACE_END
