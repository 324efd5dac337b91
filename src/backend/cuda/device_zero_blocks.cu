// ZeRO stages 2 and 3's parameter blocks on the device (see device_zero_blocks.h). Compiled in both builds.
#include "backend/cuda/device_zero_blocks.h"

#include <algorithm>

#include "llamatrain/error.h"
#include "llamatrain/zero_blocks.h"
#include "optimizer.cuh"

LT_CUDA_NAMESPACE_BEGIN

DeviceZeroComm::DeviceZeroComm(std::unique_ptr<DeviceComm> device, Comm& host, const ShardLayout& shards,
                               cudaStream_t stream, bool wire_bf16, size_t wire_elems)
    : ZeroComm(shards, host.rank()), device_(std::move(device)), host_(host), stream_(stream), wire_bf16_(wire_bf16) {
  if (wire_bf16) wire_.resize(std::max<size_t>(1, std::min(wire_elems, kWireWindow)));
}

template <class T>
void DeviceZeroComm::sum(ZeroOp op, T* buf, size_t b, size_t e, const std::string& what) {
  if (op == ZeroOp::kAllReduce) {
    device_->set_context(what + step_text());
    device_->allreduce_sum(buf, e - b);
    return;
  }
  device_->group_begin();
  for (int r = int(b / shards_.shard); r < shards_.world && size_t(r) * shards_.shard < e; ++r) {
    const size_t pb = std::max(b, size_t(r) * shards_.shard), pe = std::min(e, size_t(r + 1) * shards_.shard);
    if (pb >= pe) continue;
    device_->set_context(strcat(what, " for rank ", r, step_text()));
    device_->reduce_sum(buf + (pb - b), pe - pb, r);
  }
  device_->group_end();
}

void DeviceZeroComm::run_reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& what) {
  const double bytes = (wire_bf16_ ? 2.0 : 4.0) * double(end - begin);
  if (op == ZeroOp::kAllReduce) volume_.allreduce += 2 * ring_bytes(bytes, shards_.world);
  else volume_.reduce_scatter += ring_bytes(bytes, shards_.world);
  if (!wire_bf16_) return sum(op, buf, begin, end, what);
  // A window at a time through the bf16 scratch, which the collective stream orders for reuse.
  for (size_t w = begin; w < end; w += wire_.size()) {
    const size_t e = std::min(end, w + wire_.size());
    cast_f32_to_bf16_cuda(wire_.data(), buf + (w - begin), e - w, stream_);
    sum(op, wire_.data(), w, e, "bf16 " + what);
    const size_t own_b = shards_.begin(rank_), own_e = shards_.end(rank_);
    const size_t lo = op == ZeroOp::kAllReduce ? w : std::max(w, own_b);
    const size_t hi = op == ZeroOp::kAllReduce ? e : std::min(e, own_e);
    if (lo < hi) cast_bf16_to_f32_cuda(buf + (lo - begin), wire_.data() + (lo - w), hi - lo, stream_);
  }
}

void DeviceZeroComm::run_gather(size_t begin, size_t end, void* buf, const std::string& what) {
  auto* p = static_cast<__nv_bfloat16*>(buf);
  device_->set_context(what + step_text());
  for_windows(shards_.pieces(begin, end), kCommWindow,
              [&](size_t at, const std::vector<size_t>& n) { device_->allgather_v(p + at, n); });
  volume_.allgather += ring_bytes(2.0 * double(end - begin), shards_.world);
}

DeviceZeroBlocks::DeviceZeroBlocks(const ParameterLayout& layout, const ShardLayout& shards, int rank,
                                   DeviceZeroComm* comm, const Options& options)
    : ShardedBlocks(comm, layout, shards, rank, options.stage, options.prefetch, true),
      comm_stream_(comm ? comm->stream() : nullptr) {}

DeviceZeroBlocks::~DeviceZeroBlocks() {
  for (auto& s : gathered_) event_destroy(s->event);
  for (auto& s : scratch_) event_destroy(s->event);
}

void DeviceZeroBlocks::bind(const __nv_bfloat16* weights, float* shard_grads, __nv_bfloat16* shard_grads_bf16) {
  LT_CHECK(!(shard_grads && shard_grads_bf16), "DeviceZeroBlocks::bind: one gradient shard at most");
  weights_ = weights;
  grads_shard_ = shard_grads;
  grads_shard_bf16_ = shard_grads_bf16;
}

template <class T>
DeviceZeroBlocks::Slot<T>* DeviceZeroBlocks::find(std::vector<std::unique_ptr<Slot<T>>>& slots, int b) {
  for (auto& s : slots)
    if (s->block == b) return s.get();
  return nullptr;
}

// A free slot for block b's n elements: the smallest free one large enough, else the largest free
// one grown, else a new one. The same calls pick the same slots every step, so only the first
// steps allocate.
template <class T>
DeviceZeroBlocks::Slot<T>& DeviceZeroBlocks::take(std::vector<std::unique_ptr<Slot<T>>>& slots, int b, size_t n) {
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
  return *pick;
}

float* DeviceZeroBlocks::hold_grads(int b, size_t n) {
  Slot<float>& s = take(scratch_, b, n);
  stream_wait_event(nullptr, s.event);  // the last reduction that read this scratch is done
  device_memset(s.data.data(), 0, n * sizeof(float));
  return s.data.data();
}

size_t DeviceZeroBlocks::held_bytes() const {
  size_t bytes = 0;
  for (const auto& s : gathered_) bytes += s->data.capacity() * sizeof(__nv_bfloat16);
  for (const auto& s : scratch_) bytes += s->data.capacity() * sizeof(float);
  return bytes;
}

// After the compute queued so far: the optimizer's writes to the shard, the backward work that
// wrote a scratch, and the last reads of what a slot held before.
void DeviceZeroBlocks::before_collective() { stream_wait(comm_stream_, nullptr); }

void DeviceZeroBlocks::copy_own(__nv_bfloat16* dst, const __nv_bfloat16* src, size_t n) {
  copy_on_device(dst, src, n * sizeof(__nv_bfloat16), comm_stream_);
}

void DeviceZeroBlocks::gathered(int b) {
  event_record(find(gathered_, b)->event, comm_stream_);
  pending_ = true;
}

void DeviceZeroBlocks::reading(int b) {
  if (stage_ == 2) {
    if (weights_wait_) weights_wait_(b);
  } else {
    stream_wait_event(nullptr, find(gathered_, b)->event);  // the compute stream waits; the host does not
  }
}

// On the collective stream after the reduction (the compute stream with one rank).
void DeviceZeroBlocks::add_own(size_t at, const float* g, size_t n) {
  if (grads_shard_) add_inplace_cuda(grads_shard_ + at, g, n, comm_stream_);
  else add_stochastic_bf16_cuda(grads_shard_bf16_ + at, g, n, mix64(++shard_adds_), at, comm_stream_);
}

// After the add: what the host waits for (settle) covers all this block's work on the collective
// stream, and the scratch's next zeroing waits for it.
void DeviceZeroBlocks::reduced(int b) {
  if (comm_) pending_ = true;
  event_record(find(scratch_, b)->event, comm_stream_);
}

DeviceFrozenShards::DeviceFrozenShards(const ParameterLayout& layout, const ShardLayout& shards, Comm& comm,
                                       const DeviceCollectives& collectives) {
  if (comm.size() > 1) {
    stream_ = stream_create();
    comm_ = std::make_unique<DeviceZeroComm>(make_device_comm(comm, stream_, collectives.timeout_s), comm, shards,
                                             stream_, false, 0);
  }
  shard_.resize(shards.shard);
  DeviceZeroBlocks::Options options;
  options.stage = 3;
  options.prefetch = collectives.zero3_prefetch > 0;
  blocks_ = std::make_unique<DeviceZeroBlocks>(layout, shards, comm.rank(), comm_.get(), options);
  blocks_->bind(shard_.data(), nullptr);
  own_ = shards.end(comm.rank()) - shards.begin(comm.rank());
}

DeviceFrozenShards::~DeviceFrozenShards() {
  blocks_.reset();  // its events, before the stream they were recorded on
  comm_.reset();
  if (stream_) stream_destroy(stream_);
}

void DeviceFrozenShards::load(const float* own) { copy_to_device_bf16(shard_.data(), own, own_); }

void DeviceFrozenShards::settle() {
  if (!blocks_->pending()) return;
  comm_->device().synchronize();
  blocks_->settled();
}

LT_CUDA_NAMESPACE_END
