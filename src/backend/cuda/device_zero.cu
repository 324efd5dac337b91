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
    : ZeroSteps(ZeroPlan(layout, host.comm().size(), host.stage(),
                         ZeroPlanOptions{collectives.bucket_bytes, collectives.zero3_prefetch > 0, false}),
                host.comm().rank()),
      pieces_(host.adamw().ranges()),
      cfg_(host.adamw().config()),
      wire_bf16_(host.grad_reduce() == DType::kBF16) {
  LT_CHECK(plan_.shards().n == host.shards().n && own_begin_ == host.own_begin() && own_end_ == host.own_end(),
           "DeviceZero: the plan's shards are not the host optimizer's");
  const int stage = this->stage();
  const size_t own = own_end_ - own_begin_;
  if (collectives.offload_optimizer) {
    LT_CHECK(stage >= 1 && host.sharded_params(), "DeviceZero: --offload-optimizer at ZeRO stage ", stage,
             " (needs the host's shard of the weights: stages 1-3)");
    host_adam_ = &host.adamw();
    host_master_ = host.shard_params().data();
  } else {
    master_.resize(own);
    m_.resize(own);
    v_.resize(own);
  }
  sq_.resize(1);
  sq_scratch_.resize(sum_squares_scratch_doubles(own));
  if (host.comm().size() > 1) {
    comm_stream_ = stream_create();
    // The bf16 scratch covers the largest range reduced at once: a bucket (stages 0, 1) or a block.
    size_t largest = 0;
    const GradientBuckets& k = plan_.buckets();
    for (size_t i = 0; i < k.size(); ++i) largest = std::max(largest, k.bounds[i + 1] - k.bounds[i]);
    for (const auto& blk : layout.blocks) largest = std::max(largest, blk.size());
    zc_ = std::make_unique<DeviceZeroComm>(
        comm ? std::move(comm) : make_device_comm(host.comm(), comm_stream_, collectives.timeout_s), host.comm(),
        plan_.shards(), comm_stream_, wire_bf16_, largest);
    set_comm(zc_.get());
    if (stage == 1 || stage == 2)
      for (size_t b = 0; b < layout.blocks.size(); ++b) gathered_.push_back(event_create());
  }
  if (stage >= 2) {
    if (bf16_shard()) shard_grads_bf16_.resize(own);  // half the bytes (grad_shard.h)
    else shard_grads_.resize(own);
    DeviceZeroBlocks::Options options;
    options.stage = stage;
    options.prefetch = plan_.options().prefetch;
    blocks_ = std::make_unique<DeviceZeroBlocks>(layout, plan_.shards(), host.comm().rank(), zc_.get(), options);
  }
  if (stage == 3) {
    shard_bf16_.resize(own);
    blocks_->bind(shard_bf16_.data(), shard_grads_.data(), shard_grads_bf16_.data());
  }
}

void DeviceZero::bind_working_weights(const __nv_bfloat16* params) {
  if (stage() != 2) return;
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
    if (stage() == 3) upload_working_weights(shard_bf16_.data());
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
  if (stage() == 3) cast_f32_to_bf16_cuda(shard_bf16_.data(), master_.data(), own, nullptr);
}

void DeviceZero::clear_shard_grads() {
  if (stage() < 2) return;
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

// The step's reductions were issued: the host waits for them (stages 2, 3: the blocks' and the
// last step's gathers, then the compute stream does, before the clipping reads the shard).
void DeviceZero::reductions_done() {
  zc_->device().synchronize();
  if (blocks_) {
    blocks_->settled();
    stream_wait(nullptr, comm_stream_);
  }
  gathers_pending_ = compute_waits_gathers_ = false;
}

double DeviceZero::own_sum_squares(float* grads) {
  const size_t own = own_end_ - own_begin_;
  if (bf16_shard()) sum_squares_cuda(sq_.data(), shard_grads_bf16_.data(), own, sq_scratch_.data(), nullptr);
  else sum_squares_cuda(sq_.data(), own_grads(grads), own, sq_scratch_.data(), nullptr);
  double sq = 0;
  copy_to_host(&sq, sq_.data(), sizeof sq);
  return sq;
}

void DeviceZero::scale_own(float* grads, float s) {
  if (bf16_shard()) scale_inplace_cuda(shard_grads_bf16_.data(), s, own_end_ - own_begin_, nullptr);
  else scale_inplace_cuda(own_grads(grads), s, own_end_ - own_begin_, nullptr);
}

void DeviceZero::step(__nv_bfloat16* params, const float* grads, float lr, int64_t t) {
  if (offloaded()) step_on_host(own_working(params), grads, lr, t);
  else adamw_on_device(own_working(params), grads, lr, t);
  gather_working_copy(params, " after the update");  // no wait: the next step's work follows on the same stream
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
  LT_CHECK(stage() == 1 || stage() == 2, "DeviceZero::publish_working_copy at ZeRO stage ", stage());
  if (offloaded()) upload_working_weights(params + own_begin_);
  else cast_f32_to_bf16_cuda(params + own_begin_, master_.data(), own_end_ - own_begin_, nullptr);
  gather_working_copy(params, " at start");
}

void DeviceZero::gather_working_copy(__nv_bfloat16* params, const std::string& when) {
  if (gathered_.empty()) return;  // one rank, or stage 0 or 3
  gather_weights(params, "bf16 weights", when);
  gathers_pending_ = true;
  compute_waits_gathers_ = false;
}

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
