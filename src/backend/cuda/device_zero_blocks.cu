// ZeRO stages 2 and 3's parameter blocks on the device (see device_zero_blocks.h). Compiled in both builds.
#include "backend/cuda/device_zero_blocks.h"

#include <algorithm>

#include "llamatrain/error.h"
#include "llamatrain/zero_blocks.h"
#include "optimizer.cuh"

LT_CUDA_NAMESPACE_BEGIN

std::string parameter_block_name(const ParameterLayout& layout, int b) {
  if (b == 0) return "the embedding";
  if (b == layout.head_block()) return "the final norm and output head";
  return strcat("layer ", b - 1);
}

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
    : layout_(layout),
      shards_(shards),
      own_begin_(shards.begin(rank)),
      own_end_(shards.end(rank)),
      comm_(comm),
      comm_stream_(comm ? comm->stream() : nullptr),
      options_(options) {
  LT_CHECK(options.stage == 2 || options.stage == 3, "DeviceZeroBlocks: ZeRO stage ", options.stage);
}

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
  comm_->gather(blk.begin, blk.end, buf, "ZeRO-3 weights of " + parameter_block_name(layout_, b));
  event_record(s.event, comm_stream_);
  issued();
  return s;
}

void DeviceZeroBlocks::prefetch(int b) {
  if (options_.stage == 3 && options_.prefetch && comm_ && !find(gathered_, b)) gather(b);
}

const __nv_bfloat16* DeviceZeroBlocks::acquire(int b) {
  LT_CHECK(weights_, "DeviceZeroBlocks::acquire before bind");
  if (options_.stage == 2) {
    if (weights_wait_) weights_wait_(b);
    return weights_ + layout_.blocks[size_t(b)].begin;
  }
  if (!comm_) return weights_ + layout_.blocks[size_t(b)].begin;  // one rank: its shard is the whole model
  Slot<__nv_bfloat16>* s = find(gathered_, b);
  if (!s) s = &gather(b);
  if (s->users++ == 0) stream_wait_event(nullptr, s->event);  // the compute stream waits; the host does not
  return s->data.data();
}

void DeviceZeroBlocks::release(int b) {
  if (options_.stage == 2 || !comm_) return;
  Slot<__nv_bfloat16>* s = find(gathered_, b);
  LT_CHECK(s && s->users > 0, "DeviceZeroBlocks: block ", b, " released but not acquired");
  if (--s->users == 0) s->block = -1;  // a later gather orders itself after the reads queued so far
}

float* DeviceZeroBlocks::grads(int b) {
  if (frozen()) return nullptr;
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
  LT_CHECK(weights_, "DeviceZeroBlocks::grads_done before bind");
  if (frozen()) return;
  Slot<float>* s = find(scratch_, b);
  LT_CHECK(s, "DeviceZeroBlocks: gradients of block ", b, " done but never written");
  const ParameterLayout::Block& blk = layout_.blocks[size_t(b)];
  float* g = s->data.data();
  const size_t lo = std::max(blk.begin, own_begin_), hi = std::min(blk.end, own_end_);
  cudaStream_t add_on = nullptr;
  if (comm_) {
    // After the backward work that wrote the scratch.
    stream_wait(comm_stream_, nullptr);
    comm_->reduce(ZeroOp::kReduceScatter, blk.begin, blk.end, g, "gradients of " + parameter_block_name(layout_, b));
    add_on = comm_stream_;
  }
  if (lo < hi && grads_shard_) add_inplace_cuda(grads_shard_ + (lo - own_begin_), g + (lo - blk.begin), hi - lo, add_on);
  if (lo < hi && grads_shard_bf16_)
    add_stochastic_bf16_cuda(grads_shard_bf16_ + (lo - own_begin_), g + (lo - blk.begin), hi - lo,
                             mix64(++shard_adds_), lo - own_begin_, add_on);
  // After the add: what the host waits for (settle) covers all this block's
  // work on the collective stream.
  if (comm_) issued();
  event_record(s->event, add_on);
  s->block = -1;
  s->users = 0;
}

void DeviceZeroBlocks::issued() { pending_ = true; }

void DeviceZeroBlocks::held_changed() {
  size_t bytes = 0;
  for (const auto& s : gathered_) bytes += s->data.capacity() * sizeof(__nv_bfloat16);
  for (const auto& s : scratch_) bytes += s->data.capacity() * sizeof(float);
  peak_bytes_ = std::max(peak_bytes_, bytes);
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
