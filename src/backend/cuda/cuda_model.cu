// Llama 2 on the CUDA backend (see cuda_model.h).
#include "backend/cuda/cuda_model.h"

#include <cstring>
#include <utility>
#include <vector>

#include "backend/cuda/pass_ops.h"
#include "llamatrain/error.h"
#include "model/llama2_pass.h"

LT_CUDA_NAMESPACE_BEGIN

namespace {
constexpr size_t kLossSlots = 64;  // micro-batches per step before take_loss_sum() reads early
}  // namespace

CudaModel::CudaModel(const Llama2Config& cfg)
    : cfg_(cfg), layout_(cfg), ops_(std::make_unique<PassOps>()),
      pass_(std::make_unique<Llama2Pass<PassOps>>(cfg_, layout_)) {
  const int hd = cfg_.head_dim();
  LT_CHECK(hd == 16 || hd == 32 || hd == 64 || hd == 128, "the CUDA backend's attention supports head_dim 16, 32, ",
           "64 and 128; this model has ", hd);
  // The whole bf16 weights and fp32 gradients are allocated when first used (set_params,
  // clear_grads, init_optimizer): ZeRO stage 3 never allocates them, stage 2 not the gradients.
  loss_slots_.resize(kLossSlots);
  copy_stream_ = stream_create();
  for (BatchSlot& s : slots_) s.copied = event_create(), s.released = event_create();
}

CudaModel::~CudaModel() {
  if (sets_host_wait_hook_) set_host_wait_hook(nullptr);
  // The copies still queued read the staging and write the slots: done before either goes.
  try {
    stream_synchronize(copy_stream_);
  } catch (...) {  // an earlier asynchronous error; nothing to add to it here
  }
  stream_destroy(copy_stream_);
  for (BatchSlot& s : slots_) event_destroy(s.copied), event_destroy(s.released);
}

void CudaModel::set_params(const float* host) {
  // The padding past layout().total() (ZeRO shards) stays 0.
  if (params_.size() < layout_.total()) params_.resize(layout_.total());
  copy_to_device_bf16(params_.data(), host, layout_.total());
}

void CudaModel::clear_grads() {
  if (zero_ && zero_->blocks()) return zero_->clear_shard_grads();
  if (grads_.size() < layout_.total()) grads_.resize(layout_.total());
  device_memset(grads_.data(), 0, grads_.size() * sizeof(float));
}

namespace {
// The batch's arrays packed into one buffer, each at a 256-byte boundary: inputs, targets, pos,
// seg_start (int32) and loss_mask (uint8), n each; offset[5] is the total.
struct BatchArraysLayout {
  size_t offset[6] = {};
  explicit BatchArraysLayout(size_t n) {
    const size_t bytes[5] = {4 * n, 4 * n, 4 * n, 4 * n, n};
    for (int i = 0; i < 5; ++i) offset[i + 1] = (offset[i] + bytes[i] + 255) / 256 * 256;
  }
};
}  // namespace

Batch CudaModel::upload(const Batch& b) {
  LT_CHECK(b.B > 0 && b.T > 0, "empty batch");
  LT_CHECK(b.T <= cfg_.max_seq_len, "sequence length ", b.T, " exceeds the model's max_seq_len ", cfg_.max_seq_len);
  check_batch_ids(b, cfg_.vocab_size);
  const size_t n = size_t(b.B) * b.T;
  const BatchArraysLayout L(n);
  const void* host[5] = {b.inputs, b.targets, b.pos, b.seg_start, b.loss_mask};
  const size_t bytes[5] = {4 * n, 4 * n, 4 * n, 4 * n, n};
  auto* staged = static_cast<uint8_t*>(batch_staging_.next(L.offset[5]));
  for (int i = 0; i < 5; ++i)
    if (host[i]) std::memcpy(staged + L.offset[i], host[i], bytes[i]);
  BatchSlot& s = slots_[next_slot_];
  next_slot_ ^= 1;
  s.data.resize(L.offset[5]);
  // One copy of the packed arrays (the gaps of absent ones are never read), after the last passes
  // that read this slot; the compute stream then waits for it.
  stream_wait_event(copy_stream_, s.released);
  copy_to_device_async(s.data.data(), staged, L.offset[5], copy_stream_);
  batch_staging_.copies_queued(copy_stream_);
  event_record(s.copied, copy_stream_);
  stream_wait_event(ops_->stream, s.copied);
  batch_slot_ = &s;
  auto at = [&](int i) { return host[i] ? s.data.data() + L.offset[i] : nullptr; };
  Batch d;
  d.B = b.B;
  d.T = b.T;
  d.inputs = reinterpret_cast<const int32_t*>(at(0));
  d.targets = reinterpret_cast<const int32_t*>(at(1));
  d.pos = reinterpret_cast<const int32_t*>(at(2));
  d.seg_start = reinterpret_cast<const int32_t*>(at(3));
  d.loss_mask = at(4);
  return d;
}

void CudaModel::set_attention(Attention attention) {
  if (attention == Attention::kCudnn) cudnn_attention_prepare();
  ops_->attention = attention;
}

double CudaModel::run_forward(const Batch& host_batch) {
  if (ops_->attention == Attention::kCudnn && host_batch.seg_start) {
    const size_t n = size_t(host_batch.B) * host_batch.T;
    for (size_t i = 0; i < n; ++i)
      if (host_batch.seg_start[i] > 0)
        fail(strcat("--attention cudnn: this batch packs several examples into a row (row ", i / host_batch.T,
                    ", token ", i % host_batch.T, " starts its example at ", host_batch.seg_start[i],
                    "), which cuDNN's causal attention cannot mask; train on this data with --attention native"));
  }
  const Batch d = upload(host_batch);
  if (lora_) pass_->set_lora(lora_, lora_params_.data(), lora_grads_.data(), lora_stream_);
  ParamBlocks<__nv_bfloat16, float>* blocks = pass_blocks();
  const double loss = blocks ? pass_->forward(*ops_, *blocks, d) : pass_->forward(*ops_, params_.data(), d);
  event_record(batch_slot_->released, ops_->stream);
  device_batch_ = d;
  batch_rows_ = d.B * d.T;
  return loss;
}

double CudaModel::forward(const Batch& host_batch, float* token_losses) {
  const double loss = run_forward(host_batch);
  if (token_losses && device_batch_.targets) {
    copy_to_host(token_losses, pass_->token_losses(), size_t(batch_rows_) * sizeof(float));
  }
  return loss;
}

void CudaModel::forward_deferred(const Batch& host_batch) {
  if (pending_losses_ == loss_slots_.size()) loss_carry_ = take_loss_sum();  // more micro-batches than slots
  double* slot = loss_slots_.data() + pending_losses_++;
  device_memset(slot, 0, sizeof *slot);  // a batch without targets has loss 0
  ops_->loss_out = slot;
  try {
    run_forward(host_batch);
  } catch (...) {
    ops_->loss_out = nullptr;
    throw;
  }
  ops_->loss_out = nullptr;
}

cudaStream_t CudaModel::ops_stream() const { return ops_->stream; }

ParamBlocks<__nv_bfloat16, float>* CudaModel::pass_blocks() {
  if (zero_ && zero_->blocks()) return zero_->blocks();
  return frozen_ ? &frozen_->blocks() : nullptr;
}

void CudaModel::enable_lora(const LoraLayout& lora) {
  lora_ = &lora;
  lora_params_.resize(lora.total());
  lora_grads_.resize(lora.total());
  clear_lora_grads();
}

void CudaModel::set_lora_params(const float* host) {
  LT_CHECK(lora_, "set_lora_params() before enable_lora()");
  copy_to_device_bf16(lora_params_.data(), host, lora_->total());
}

void CudaModel::clear_lora_grads() { device_memset(lora_grads_.data(), 0, lora_grads_.size() * sizeof(float)); }

void CudaModel::lora_grads_to_host(float* host) const {
  copy_to_host(host, lora_grads_.data(), lora_grads_.size() * sizeof(float));
}

void CudaModel::set_frozen_shards(const float* own, const ShardLayout& shards, Comm& comm) {
  if (!frozen_) {
    params_ = DeviceBuffer<__nv_bfloat16>();
    frozen_ = std::make_unique<DeviceFrozenShards>(layout_, shards, comm, collectives_);
    DeviceFrozenShards* frozen = frozen_.get();
    set_host_wait_hook([frozen] { frozen->settle(); });
    sets_host_wait_hook_ = true;
  }
  frozen_->load(own);
}

CommVolume CudaModel::frozen_volume() const { return frozen_ ? frozen_->volume() : CommVolume{}; }

double CudaModel::take_loss_sum() {
  std::vector<double> losses(pending_losses_);
  copy_to_host(losses.data(), loss_slots_.data(), losses.size() * sizeof(double));
  // In call order from what earlier reads summed: the sum `loss += forward()` would give.
  double sum = loss_carry_;
  for (double l : losses) sum += l;
  pending_losses_ = 0;
  loss_carry_ = 0;
  return sum;
}

void CudaModel::run_backward(const Batch& host_batch, float dloss) {
  // The batch forward() copied to the device (same batch by contract; the shape is checked).
  LT_CHECK(host_batch.B * host_batch.T == batch_rows_ && device_batch_.B == host_batch.B,
           "backward() without a matching forward()");
  ops_->host_tokens = host_batch.inputs;
  if (ParamBlocks<__nv_bfloat16, float>* blocks = pass_blocks()) {
    pass_->backward(*ops_, *blocks, device_batch_, dloss);
  } else if (lora_) {
    pass_->backward(*ops_, params_.data(), nullptr, device_batch_, dloss);  // the base frozen: no dW
  } else {
    if (grads_.size() < layout_.total()) clear_grads();  // the first backward without clear_grads()
    pass_->backward(*ops_, params_.data(), grads_.data(), device_batch_, dloss);
  }
  ops_->host_tokens = nullptr;
  ops_->on_grads_final = nullptr;
  // No synchronisation: the host goes on to the next batch while the device works.
  event_record(batch_slot_->released, ops_->stream);
}

void CudaModel::backward(const Batch& host_batch, float dloss) { run_backward(host_batch, dloss); }

void CudaModel::grads_to_host(float* host) const {
  LT_CHECK(!(zero_ && zero_->blocks()), "grads_to_host() with ZeRO stage 2 or 3: no whole gradient buffer");
  copy_to_host(host, grads_.data(), layout_.total() * sizeof(float));
}

namespace {
// The host optimizer's moments for DeviceZero::load_state: null while they are still zero (a
// fresh run), so the device sets them with a memset rather than copying host zeros.
std::pair<const float*, const float*> host_moments(const ZeroOptimizer& host) {
  const AdamW& adam = host.adamw();
  if (adam.moments_zero()) return {nullptr, nullptr};
  return {adam.m().data(), adam.v().data()};
}
}  // namespace

// The host-wait rule (device.h): every host wait of the runtime first settles the collectives of
// this rank's optimizer.
void CudaModel::set_settle_hook() {
  DeviceZero* zero = zero_.get();
  set_host_wait_hook([zero] { zero->settle(); });
  sets_host_wait_hook_ = true;
}

void CudaModel::init_optimizer(ZeroOptimizer& host, const float* params, std::unique_ptr<DeviceComm> comm) {
  const auto [m, v] = host_moments(host);
  if (host.stage() == 3) {
    // Stage 3: only the shards (device_zero.h), from the host's shard of the weights.
    params_ = DeviceBuffer<__nv_bfloat16>();
    grads_ = DeviceBuffer<float>();
    ops_->on_weights_needed = nullptr;
    zero_ = std::make_unique<DeviceZero>(layout_, host, collectives_, std::move(comm));
    set_settle_hook();
    zero_->clear_shard_grads();
    zero_->load_state(host.shard_params().data(), m, v);
    return;
  }
  zero_ = std::make_unique<DeviceZero>(layout_, host, collectives_, std::move(comm));
  set_settle_hook();
  DeviceZero* zero = zero_.get();
  PassOps* ops = ops_.get();
  ops_->on_weights_needed = [zero, ops](int b) { zero->wait_for_weights(ops->stream, b); };
  params_.resize(zero_->padded());
  device_memset(params_.data(), 0, params_.size() * sizeof(__nv_bfloat16));
  if (host.sharded_params()) {
    // The host holds only this rank's shard: the state from it, and the working copy of the other
    // ranks' ranges all-gathered on the device (the same bits set_params would give: both round
    // the fp32 master to nearest even).
    zero_->load_state(host.shard_params().data(), m, v);
    zero_->publish_working_copy(params_.data());
  } else {
    set_params(params);
    zero_->load_state(params + host.own_begin(), m, v);
  }
  if (zero_->blocks()) {
    // Stage 2: the gradients only as the rank's shard (device_zero.h).
    grads_ = DeviceBuffer<float>();
    zero_->bind_working_weights(params_.data());
  } else {
    grads_.resize(zero_->padded());
  }
  clear_grads();
}

void CudaModel::idle_forward() {
  ParamBlocks<__nv_bfloat16, float>* blocks = pass_blocks();
  LT_CHECK(blocks, "idle_forward() without ZeRO stage 2 or 3");
  idle_forward_blocks(*blocks, layout_);
}

void CudaModel::idle_backward() {
  ParamBlocks<__nv_bfloat16, float>* blocks = pass_blocks();
  LT_CHECK(blocks, "idle_backward() without ZeRO stage 2 or 3");
  idle_backward_blocks(*blocks, layout_);
}

void CudaModel::set_step(int64_t step) {
  if (zero_) zero_->set_step(step);
  if (frozen_) frozen_->set_step(step);
}

void CudaModel::backward_last(const Batch& host_batch, float dloss) {
  LT_CHECK(zero_, "backward_last() before init_optimizer()");
  zero_->begin_reduction();
  if (zero_->blocks()) return run_backward(host_batch, dloss);  // stages 2, 3: reduced block by block
  float* grads = grads_.data();
  DeviceZero* zero = zero_.get();
  ops_->on_grads_final = [zero, grads](size_t offset) { zero->grads_final_from(grads, offset); };
  run_backward(host_batch, dloss);
}

double CudaModel::reduce_and_clip_grads(float max_norm) {
  LT_CHECK(zero_, "reduce_and_clip_grads() before init_optimizer()");
  zero_->finish_reduction(grads_.data());
  return zero_->clip(grads_.data(), max_norm);
}

CommVolume CudaModel::comm_volume() const { return zero_ ? zero_->volume() : CommVolume{}; }

cudaStream_t CudaModel::device_comm_stream() const { return zero_ ? zero_->comm_stream() : nullptr; }

void CudaModel::optimizer_step(float lr, int64_t t) {
  LT_CHECK(zero_, "optimizer_step() before init_optimizer()");
  zero_->step(params_.data(), grads_.data(), lr, t);
}

void CudaModel::optimizer_state_to_host(ZeroOptimizer& host, float* params) const {
  LT_CHECK(zero_, "optimizer_state_to_host() before init_optimizer()");
  float* own = host.sharded_params() ? host.shard_params().data() : params + host.own_begin();
  zero_->state_to_host(own, host.adamw().m().data(), host.adamw().v().data());
}

void CudaModel::logits_to_host(float* host) const {
  const size_t n = size_t(batch_rows_) * cfg_.vocab_size;
  std::vector<__nv_bfloat16> bf(n);
  copy_to_host(bf.data(), pass_->logits(), n * sizeof(__nv_bfloat16));
  for (size_t i = 0; i < n; ++i) host[i] = __bfloat162float(bf[i]);
}

void CudaModel::set_recompute(Recompute r) { pass_->set_recompute(r); }

size_t CudaModel::activation_bytes(int B, int Tn) const { return pass_->activation_bytes(B, Tn); }

LT_CUDA_NAMESPACE_END
