// The ZeRO-sharded AdamW on the device (see device_zero.h). Compiled in both builds.
#include "backend/cuda/device_zero.h"

#include <algorithm>
#include <cmath>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/zero_blocks.h"
#include "optimizer.cuh"

LT_CUDA_NAMESPACE_BEGIN

DeviceZero::DeviceZero(const ParameterLayout& layout, ZeroOptimizer& host, const DeviceCollectives& collectives,
                       std::unique_ptr<DeviceComm> comm)
    : stage_(host.stage()),
      rank_(host.comm().rank()),
      world_(host.comm().size()),
      n_(host.shards().n),
      padded_(host.shards().padded),
      own_begin_(host.own_begin()),
      own_end_(host.own_end()),
      norm_begin_(stage_ == 0 ? 0 : host.shards().begin(rank_)),
      norm_end_(stage_ == 0 ? n_ : host.shards().end(rank_)),
      pieces_(host.adamw().ranges()),
      cfg_(host.adamw().config()),
      host_(host.comm()),
      layout_(layout),
      plan_(layout, world_, stage_, ZeroPlanOptions{collectives.bucket_bytes, collectives.zero3_prefetch > 0, false}),
      wire_bf16_(host.grad_reduce() == DType::kBF16) {
  LT_CHECK(n_ == layout.total(), "DeviceZero: the optimizer's ", n_, " parameters are not the layout's ",
           layout.total());
  const size_t own = own_end_ - own_begin_;
  if (collectives.offload_optimizer) {
    LT_CHECK(stage_ >= 1 && host.sharded_params(), "DeviceZero: --offload-optimizer at ZeRO stage ", stage_,
             " (needs the host's shard of the weights: stages 1-3)");
    host_adam_ = &host.adamw();
    host_master_ = host.shard_params().data();
  } else {
    master_.resize(own);
    m_.resize(own);
    v_.resize(own);
  }
  sq_.resize(1);
  sq_scratch_.resize(sum_squares_scratch_doubles(norm_end_ - norm_begin_));
  LT_CHECK(plan_.shards().padded == padded_, "DeviceZero: the plan's shards are not the host optimizer's");
  if (world_ > 1) {
    comm_stream_ = stream_create();
    // The bf16 scratch covers the largest range reduced at once: a bucket (stages 0, 1) or a block.
    size_t largest = 0;
    const GradientBuckets& k = plan_.buckets();
    for (size_t i = 0; i < k.size(); ++i) largest = std::max(largest, k.bounds[i + 1] - k.bounds[i]);
    for (const auto& blk : layout.blocks) largest = std::max(largest, blk.size());
    zc_ = std::make_unique<DeviceZeroComm>(comm ? std::move(comm) : make_device_comm(host_, comm_stream_, collectives.timeout_s),
                                           host_, plan_.shards(), comm_stream_, wire_bf16_, largest);
    if (stage_ == 1 || stage_ == 2)
      for (size_t b = 0; b < layout.blocks.size(); ++b) gathered_.push_back(event_create());
  }
  if (stage_ >= 2) {
    if (bf16_shard()) shard_grads_bf16_.resize(own);  // half the bytes (grad_shard.h)
    else shard_grads_.resize(own);
    DeviceZeroBlocks::Options options;
    options.stage = stage_;
    options.prefetch = plan_.options().prefetch;
    blocks_ = std::make_unique<DeviceZeroBlocks>(layout, plan_.shards(), rank_, zc_.get(), options);
  }
  if (stage_ == 3) {
    shard_bf16_.resize(own);
    blocks_->bind(shard_bf16_.data(), shard_grads_.data(), shard_grads_bf16_.data());
  }
}

void DeviceZero::bind_working_weights(const __nv_bfloat16* params) {
  if (stage_ != 2) return;
  blocks_->bind(params, shard_grads_.data(), shard_grads_bf16_.data());
  blocks_->set_weights_wait([this](int b) { wait_for_weights(nullptr, b); });
}

DeviceZero::~DeviceZero() {
  for (DeviceEvent e : gathered_) event_destroy(e);
  blocks_.reset();
  zc_.reset();
  stream_destroy(comm_stream_);
}

void DeviceZero::load_state(const float* own_params, const float* m, const float* v) {
  const size_t own = own_end_ - own_begin_;
  if (offloaded()) {
    if (own_params != host_master_) std::copy(own_params, own_params + own, host_master_);
    // Null moments: the host optimizer's own, still zero.
    if (m && m != host_adam_->m().data()) std::copy(m, m + own, host_adam_->m().data());
    if (v && v != host_adam_->v().data()) std::copy(v, v + own, host_adam_->v().data());
    if (stage_ == 3) upload_working_weights(shard_bf16_.data());
    return;
  }
  copy_to_device(master_.data(), own_params, own * sizeof(float));
  LT_CHECK(!m == !v, "DeviceZero::load_state: m and v both given or both null");
  if (m) {
    copy_to_device(m_.data(), m, own * sizeof(float));
    copy_to_device(v_.data(), v, own * sizeof(float));
  } else {
    device_memset(m_.data(), 0, own * sizeof(float));
    device_memset(v_.data(), 0, own * sizeof(float));
  }
  if (stage_ == 3) cast_f32_to_bf16_cuda(shard_bf16_.data(), master_.data(), own, nullptr);
}

void DeviceZero::clear_shard_grads() {
  if (stage_ < 2) return;
  device_memset(shard_grads_.data(), 0, shard_grads_.size() * sizeof(float));
  device_memset(shard_grads_bf16_.data(), 0, shard_grads_bf16_.size() * sizeof(__nv_bfloat16));
}

void DeviceZero::state_to_host(float* own_params, float* m, float* v) const {
  const size_t own = own_end_ - own_begin_;
  if (offloaded()) {
    if (own_params != host_master_) std::copy(host_master_, host_master_ + own, own_params);
    if (m != host_adam_->m().data()) std::copy(host_adam_->m().begin(), host_adam_->m().end(), m);
    if (v != host_adam_->v().data()) std::copy(host_adam_->v().begin(), host_adam_->v().end(), v);
    return;
  }
  copy_to_host(own_params, master_.data(), own * sizeof(float));
  copy_to_host(m, m_.data(), own * sizeof(float));
  copy_to_host(v, v_.data(), own * sizeof(float));
}

void DeviceZero::begin_reduction() {
  if (blocks_) return;  // stages 2, 3: the blocks reduced every micro-batch's gradients already
  next_bucket_ = int(plan_.buckets().size()) - 1;
  reducing_ = true;
}

std::string DeviceZero::block_name(int b) const { return parameter_block_name(layout_, b); }

// A bucket's blocks: "layer 3", "layers 0-2", "the embedding and layer 0", "layer 5 and the final
// norm and output head".
std::string DeviceZero::bucket_name(size_t k) const {
  const GradientBuckets& buckets = plan_.buckets();
  const int first = buckets.first_block[k];
  const int last = k + 1 < buckets.size() ? buckets.first_block[k + 1] - 1 : layout_.head_block();
  if (first == last) return block_name(first);
  std::vector<std::string> parts;
  if (first == 0) parts.push_back(block_name(0));
  const int l0 = std::max(first, 1) - 1, l1 = std::min(last, layout_.head_block() - 1) - 1;
  if (l0 == l1) parts.push_back(strcat("layer ", l0));
  if (l0 < l1) parts.push_back(strcat("layers ", l0, "-", l1));
  if (last == layout_.head_block()) parts.push_back(block_name(last));
  std::string name = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) name += (i + 1 < parts.size() ? ", " : " and ") + parts[i];
  return name;
}

void DeviceZero::launch_bucket(float* grads, size_t k) {
  const size_t b = plan_.buckets().bounds[k], e = plan_.buckets().bounds[k + 1];
  if (b >= e) return;
  // The collective stream waits for the backward work queued so far, which wrote this bucket.
  stream_wait(comm_stream_, nullptr);
  zc_->reduce(stage_ == 0 ? ZeroOp::kAllReduce : ZeroOp::kReduceScatter, b, e, grads + b,
              "gradients of " + bucket_name(k));
}

void DeviceZero::grads_final_from(float* grads, size_t offset) {
  if (!zc_ || blocks_) return;
  for (; next_bucket_ >= 0 && plan_.buckets().bounds[size_t(next_bucket_)] >= offset; --next_bucket_)
    launch_bucket(grads, size_t(next_bucket_));
}

void DeviceZero::finish_reduction(float* grads) {
  if (!zc_) return;
  if (blocks_) {
    // Stages 2, 3: the blocks reduced into the shard on the collective stream; the host waits for
    // them (and for the gathers), then the compute stream does, before the clipping reads it.
    zc_->device().synchronize();
    blocks_->settled();
    gathers_pending_ = compute_waits_gathers_ = false;
    stream_wait(nullptr, comm_stream_);
    return;
  }
  if (!reducing_) begin_reduction();  // a rank without micro-batches this step
  grads_final_from(grads, 0);
  zc_->device().synchronize();  // the last step's weight gathers too
  reducing_ = false;
  gathers_pending_ = compute_waits_gathers_ = false;
}

double DeviceZero::clip(float* grads, float max_norm) {
  const size_t norm_n = norm_end_ - norm_begin_, own = own_end_ - own_begin_;
  if (bf16_shard()) sum_squares_cuda(sq_.data(), shard_grads_bf16_.data(), norm_n, sq_scratch_.data(), nullptr);
  else sum_squares_cuda(sq_.data(), own_grads(grads) + (norm_begin_ - own_begin_), norm_n, sq_scratch_.data(), nullptr);
  double sq = 0;
  copy_to_host(&sq, sq_.data(), sizeof sq);
  if (stage_ > 0 && zc_) sq = zc_->norm_sum(sq);
  const double norm = std::sqrt(sq);
  if (max_norm <= 0.f || norm <= max_norm) return norm;
  const float s = float(max_norm / (norm + 1e-6));
  if (bf16_shard()) scale_inplace_cuda(shard_grads_bf16_.data(), s, own, nullptr);
  else scale_inplace_cuda(own_grads(grads), s, own, nullptr);
  return norm;
}

void DeviceZero::step(__nv_bfloat16* params, const float* grads, float lr, int64_t t) {
  if (offloaded()) step_on_host(own_working(params), grads, lr, t);
  else adamw_on_device(own_working(params), grads, lr, t);
  if (!zc_ || gathered_.empty()) return;  // no wait: the next step's work follows on the same stream
  gather_working_copy(params, " after the update");
}

void DeviceZero::adamw_on_device(__nv_bfloat16* working, const float* grads, float lr, int64_t t) {
  for (const auto& piece : pieces_) {
    AdamwParams p;
    const size_t o = piece.begin - own_begin_;
    p.param = master_.data() + o;
    p.m = m_.data() + o;
    p.v = v_.data() + o;
    if (bf16_shard()) p.grad_bf16 = shard_grads_bf16_.data() + o;
    else p.grad = own_grads(const_cast<float*>(grads)) + o;
    p.param_bf16 = working + o;
    p.n = piece.end - piece.begin;
    p.lr = lr;
    p.beta1 = cfg_.beta1;
    p.beta2 = cfg_.beta2;
    p.eps = cfg_.eps;
    p.weight_decay = piece.decay ? cfg_.weight_decay : 0.f;
    p.t = int(t);
    adamw_update_cuda(p, nullptr);
  }
}

void DeviceZero::step_on_host(__nv_bfloat16* working, const float* grads, float lr, int64_t t) {
  const size_t own = own_end_ - own_begin_;
  std::vector<float> g(std::min(own, kHostWindow));
  std::vector<uint16_t> wire(g.size());
  const float* g_dev = bf16_shard() ? nullptr : own_grads(const_cast<float*>(grads));
  for (size_t lo = 0; lo < own; lo += g.size()) {
    const size_t n = std::min(g.size(), own - lo);
    if (g_dev) {
      copy_to_host(g.data(), g_dev + lo, n * sizeof(float));
    } else {
      copy_to_host(wire.data(), shard_grads_bf16_.data() + lo, n * sizeof(uint16_t));
      cpu::widen_bf16(g.data(), wire.data(), n);
    }
    host_adam_->step_window(host_master_ + lo, g.data(), own_begin_ + lo, own_begin_ + lo + n, lr, t);
    cpu::round_to_bf16(wire.data(), host_master_ + lo, n);
    copy_to_device(working + lo, wire.data(), n * sizeof(uint16_t));
  }
}

void DeviceZero::upload_working_weights(__nv_bfloat16* working) {
  const size_t own = own_end_ - own_begin_;
  std::vector<uint16_t> wire(std::min(own, kHostWindow));
  for (size_t lo = 0; lo < own; lo += wire.size()) {
    const size_t n = std::min(wire.size(), own - lo);
    cpu::round_to_bf16(wire.data(), host_master_ + lo, n);
    copy_to_device(working + lo, wire.data(), n * sizeof(uint16_t));
  }
}

void DeviceZero::publish_working_copy(__nv_bfloat16* params) {
  LT_CHECK(stage_ == 1 || stage_ == 2, "DeviceZero::publish_working_copy at ZeRO stage ", stage_);
  if (offloaded()) upload_working_weights(params + own_begin_);
  else cast_f32_to_bf16_cuda(params + own_begin_, master_.data(), own_end_ - own_begin_, nullptr);
  if (zc_) gather_working_copy(params, " at start");
}

void DeviceZero::gather_working_copy(__nv_bfloat16* params, const std::string& when) {
  // Block by block in forward order, after the update (the compute stream's work so far).
  stream_wait(comm_stream_, nullptr);
  const std::vector<ZeroCall> calls = plan_.gather_calls();
  for (size_t b = 0; b < calls.size(); ++b) {
    zc_->gather(calls[b].begin, calls[b].end, params + calls[b].begin, "bf16 weights of " + block_name(int(b)) + when);
    event_record(gathered_[b], comm_stream_);
  }
  gathers_pending_ = true;
  compute_waits_gathers_ = false;
}

CommVolume DeviceZero::volume() const { return zc_ ? zc_->volume() : CommVolume{}; }

void DeviceZero::wait_for_weights(cudaStream_t s, int b) {
  if (!gathers_pending_) return;
  stream_wait_event(s, gathered_[size_t(b)]);
  compute_waits_gathers_ = true;
}

void DeviceZero::settle() {
  if (blocks_ && blocks_->pending()) {  // stages 2, 3: the compute queued since may wait for any of them
    zc_->device().synchronize();
    blocks_->settled();
  }
  if (!gathers_pending_ || !compute_waits_gathers_) return;
  zc_->device().synchronize();
  gathers_pending_ = compute_waits_gathers_ = false;
}

LT_CUDA_NAMESPACE_END
