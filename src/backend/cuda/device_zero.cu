// The ZeRO-sharded AdamW on the device (see device_zero.h). Compiled in both builds.
#include "backend/cuda/device_zero.h"

#include <algorithm>
#include <cmath>

#include "llamatrain/error.h"
#include "optimizer.cuh"

LT_CUDA_NAMESPACE_BEGIN

DeviceZero::DeviceZero(const ParameterLayout& layout, ZeroOptimizer& host, double comm_timeout_s,
                       std::unique_ptr<DeviceComm> comm)
    : stage_(host.stage()),
      rank_(host.comm().rank()),
      world_(host.comm().size()),
      n_(host.shards().n),
      padded_(host.shards().padded),
      shard_(host.shards().shard),
      own_begin_(host.own_begin()),
      own_end_(host.own_end()),
      norm_begin_(stage_ == 0 ? 0 : host.shards().begin(rank_)),
      norm_end_(stage_ == 0 ? n_ : host.shards().end(rank_)),
      pieces_(host.adamw().ranges()),
      cfg_(host.adamw().config()),
      host_(host.comm()) {
  LT_CHECK(n_ == layout.total(), "DeviceZero: the optimizer's ", n_, " parameters are not the layout's ",
           layout.total());
  // Buckets: the embedding, each layer, then the final norm and output head with the padding
  // (tied embeddings put the output head in the first bucket, which is reduced last).
  bounds_.push_back(0);
  for (const auto& L : layout.layers) bounds_.push_back(L.attention_norm);
  bounds_.push_back(layout.norm);
  bounds_.push_back(padded_);
  const size_t own = own_end_ - own_begin_;
  master_.resize(own);
  m_.resize(own);
  v_.resize(own);
  sq_.resize(1);
  sq_scratch_.resize(sum_squares_scratch_doubles(norm_end_ - norm_begin_));
  if (world_ > 1) {
    comm_stream_ = stream_create();
    comm_ = comm ? std::move(comm) : make_device_comm(host_, comm_stream_, comm_timeout_s);
  }
  if (stage_ == 3) {
    shard_bf16_.resize(own);
    shard_grads_.resize(own);
    blocks_ = std::make_unique<DeviceZeroBlocks>(layout, host.shards(), rank_, comm_.get(), comm_stream_);
    blocks_->bind(shard_bf16_.data(), shard_grads_.data());
  }
}

DeviceZero::~DeviceZero() {
  blocks_.reset();
  comm_.reset();
  stream_destroy(comm_stream_);
}

void DeviceZero::load_state(const float* own_params, const float* m, const float* v) {
  const size_t own = own_end_ - own_begin_;
  copy_to_device(master_.data(), own_params, own * sizeof(float));
  copy_to_device(m_.data(), m, own * sizeof(float));
  copy_to_device(v_.data(), v, own * sizeof(float));
  if (stage_ == 3) cast_f32_to_bf16_cuda(shard_bf16_.data(), master_.data(), own, nullptr);
}

void DeviceZero::zero_shard_grads() {
  if (stage_ == 3) device_memset(shard_grads_.data(), 0, shard_grads_.size() * sizeof(float));
}

void DeviceZero::state_to_host(float* own_params, float* m, float* v) const {
  const size_t own = own_end_ - own_begin_;
  copy_to_host(own_params, master_.data(), own * sizeof(float));
  copy_to_host(m, m_.data(), own * sizeof(float));
  copy_to_host(v, v_.data(), own * sizeof(float));
}

void DeviceZero::begin_reduction() {
  if (stage_ == 3) return;  // the blocks reduced every micro-batch's gradients already
  next_bucket_ = int(bounds_.size()) - 2;
  reducing_ = true;
}

// Bucket k: the embedding (k = 0), layer k - 1, then the final norm and output head.
std::string DeviceZero::bucket_name(size_t k) const {
  if (k == 0) return "the embedding";
  if (k + 2 == bounds_.size()) return "the final norm and output head";
  return strcat("layer ", k - 1);
}

std::string DeviceZero::step_text() const { return step_ > 0 ? strcat(", step ", step_) : std::string(); }

void DeviceZero::launch_bucket(float* grads, size_t k) {
  const size_t b = bounds_[k], e = bounds_[k + 1];
  if (b >= e) return;
  // The collective stream waits for the backward work queued so far, which wrote this bucket.
  stream_wait(comm_stream_, nullptr);
  if (stage_ < 2) {
    comm_->set_context(strcat("gradients of ", bucket_name(k), step_text()));
    comm_->allreduce_sum(grads + b, e - b);
    return;
  }
  // Reduce-scatter with the bucket's boundaries: each owner's piece to its owner.
  comm_->group_begin();
  for (int r = int(b / shard_); r < world_ && size_t(r) * shard_ < e; ++r) {
    const size_t pb = std::max(b, size_t(r) * shard_), pe = std::min(e, size_t(r + 1) * shard_);
    if (pb >= pe) continue;
    comm_->set_context(strcat("gradients of ", bucket_name(k), " for rank ", r, step_text()));
    comm_->reduce_sum(grads + pb, pe - pb, r);
  }
  comm_->group_end();
}

void DeviceZero::grads_final_from(float* grads, size_t offset) {
  if (!comm_ || stage_ == 3) return;
  for (; next_bucket_ >= 0 && bounds_[size_t(next_bucket_)] >= offset; --next_bucket_)
    launch_bucket(grads, size_t(next_bucket_));
}

void DeviceZero::finish_reduction(float* grads) {
  if (!comm_ || stage_ == 3) return;
  if (!reducing_) begin_reduction();  // a rank without micro-batches this step
  grads_final_from(grads, 0);
  comm_->synchronize();
  reducing_ = false;
}

double DeviceZero::clip(float* grads, float max_norm) {
  sum_squares_cuda(sq_.data(), own_grads(grads) + (norm_begin_ - own_begin_), norm_end_ - norm_begin_,
                   sq_scratch_.data(), nullptr);
  double sq = 0;
  copy_to_host(&sq, sq_.data(), sizeof sq);
  if (stage_ > 0) sq = host_.allreduce_sum(sq);
  const double norm = std::sqrt(sq);
  if (max_norm > 0.f && norm > max_norm)
    scale_inplace_cuda(own_grads(grads), float(max_norm / (norm + 1e-6)), own_end_ - own_begin_, nullptr);
  return norm;
}

void DeviceZero::step(__nv_bfloat16* params, const float* grads, float lr, int64_t t) {
  for (const auto& piece : pieces_) {
    AdamwParams p;
    const size_t o = piece.begin - own_begin_;
    p.param = master_.data() + o;
    p.m = m_.data() + o;
    p.v = v_.data() + o;
    p.grad = own_grads(const_cast<float*>(grads)) + o;
    p.param_bf16 = stage_ == 3 ? shard_bf16_.data() + o : params + piece.begin;
    p.n = piece.end - piece.begin;
    p.lr = lr;
    p.beta1 = cfg_.beta1;
    p.beta2 = cfg_.beta2;
    p.eps = cfg_.eps;
    p.weight_decay = piece.decay ? cfg_.weight_decay : 0.f;
    p.t = int(t);
    adamw_update_cuda(p, nullptr);
  }
  if (comm_ && stage_ > 0 && stage_ < 3) {
    stream_wait(comm_stream_, nullptr);
    comm_->set_context(strcat("bf16 weights after the update", step_text()));
    comm_->allgather(params, shard_);
    comm_->synchronize();
  }
  // Otherwise no wait: the next step's work follows the update on the same stream.
}

LT_CUDA_NAMESPACE_END
