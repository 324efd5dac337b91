// The ZeRO-sharded AdamW on the device: lt::ZeroSteps (llamatrain/zero_plan.h: the buckets, the
// clipping norm and the gathers of a step, the host's ZeroOptimizer's too) over device memory, its
// collectives through DeviceZeroComm (NCCL on GPUs, MPI on the simulator; device_comm.h) on a
// collective stream. It takes what defines the update from the host ZeroOptimizer it is made from
// (stage, shards, this rank's range, the tensor pieces and their weight-decay flags, the Adam
// hyper-parameters), so both make the same update. What the device adds, on the CudaModel's fp32
// gradients and bf16 working weights (padded flat):
//  - Stages 0, 1: during the step's last backward the pass reports "every gradient at offset >= o
//    is final" after each block (grads_final_from), and the buckets there are launched at once,
//    overlapping the backward of the blocks below; finish_reduction() launches the rest and waits
//    (DeviceComm::synchronize: at most --comm-timeout, then the job ends naming the bucket). Stage
//    1 reduces each owner's piece of a bucket to its owner in one NCCL group (a reduce-scatter with
//    the bucket's boundaries). --grad-reduce-dtype bf16: each bucket rounded to bf16 on the
//    collective stream, reduced in bf16 and widened back, once per step.
//  - Stages 2, 3: no whole gradient buffer; blocks() (device_zero_blocks.h) reduces each block into
//    the rank's fp32 (or, with --grad-reduce-dtype bf16, bf16) gradient shard every micro-batch, and
//    stage 3 keeps only a bf16 shard of the weights, gathered block by block for the passes.
//  - The clipping's sum of squares on the device; AdamW on this rank's range with fp32 master
//    weights, m and v, writing the bf16 working copy (stage 3: its shard).
//  - Stages 1, 2: the working copy's gathers in bf16 (half the host's bytes), each block followed by
//    an event; the step does not wait for them: the next forward's compute stream waits for each
//    block's event just before it reads the block (wait_for_weights), so later layers' gathers
//    overlap earlier layers' compute. The host waits for them (settle) before it waits for compute
//    that depends on them, so that a lost peer is reported after --comm-timeout instead of hanging
//    the host in a stream synchronisation.
//  - --offload-optimizer (stages 1-3; DeepSpeed's offload_optimizer): the master weights and Adam m,
//    v are the host's arrays (ZeroOptimizer::shard_params and its AdamW), and the update runs on
//    the host a window at a time: the clipped gradient shard copied down, lt::cpu::adamw_update (the
//    kernel's twin: the same bits), the weights rounded to bf16 and copied up.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_comm.h"
#include "backend/cuda/device_zero_blocks.h"
#include "llamatrain/device.h"
#include "llamatrain/zero.h"

LT_CUDA_NAMESPACE_BEGIN

class DeviceZero final : public ZeroSteps {
 public:
  // comm: the device communicator to use; null makes one over host.comm() whose synchronize()
  // waits at most collectives.timeout_s for a collective (tests pass their own). The plan is
  // host's stage and rank count with collectives' buckets and prefetch.
  DeviceZero(const ParameterLayout& layout, ZeroOptimizer& host, const DeviceCollectives& collectives,
             std::unique_ptr<DeviceComm> comm = nullptr);
  ~DeviceZero() override;
  DeviceZero(const DeviceZero&) = delete;
  DeviceZero& operator=(const DeviceZero&) = delete;

  size_t padded() const { return plan_.shards().padded; }
  // The stream the collectives are queued on (null for one rank).
  cudaStream_t comm_stream() const { return comm_stream_; }
  // The fp32 master weights of this rank's range from own_params (host; element 0 at flat offset
  // own_begin) and Adam m, v from the host optimizer's arrays, or zeros set on the device when
  // m and v are null (a fresh run: AdamW::moments_zero); stage 3 also its bf16 shard. With the
  // optimizer offloaded the state stays on the host (copied only if these are other arrays).
  void load_state(const float* own_params, const float* m, const float* v);
  // The reverse, into the same places.
  void state_to_host(float* own_params, float* m, float* v) const;
  bool offloaded() const { return host_adam_ != nullptr; }
  // Stages 2 and 3: the blocks the passes read weights and write gradients through (null
  // otherwise), and the zeroing of the gradient shard at a step's start.
  DeviceZeroBlocks* blocks() { return blocks_.get(); }
  void clear_shard_grads();
  // Stage 2: the whole bf16 working copy (padded flat) the blocks read the weights from.
  void bind_working_weights(const __nv_bfloat16* params);

  // The reduction (ZeroSteps): during the step's last backward grads_final_from launches the
  // buckets on the collective stream; finish_reduction launches what is left and waits
  // (DeviceComm::synchronize: at most --comm-timeout, then the job ends naming the bucket).
  // AdamW on this rank's range (writes its part of params), then the all-gather of params, block
  // by block, not waited for (step 4 above).
  void step(__nv_bfloat16* params, const float* grads, float lr, int64_t t);
  // Stages 1, 2 where the host holds only its shard: this rank's range of the bf16 working copy
  // from the master weights load_state() set, and the other ranks' all-gathered (as step() does,
  // not waited for).
  void publish_working_copy(__nv_bfloat16* params);
  // Makes stream s wait for parameter block b's all-gather of the last step (nothing to wait for
  // without one).
  void wait_for_weights(cudaStream_t s, int b);
  // The host waits for the all-gathers of the last step if compute queued since waits for them:
  // call before any host wait on the compute stream (or on a stream that waits for it).
  void settle();

 private:
  double own_sum_squares(float* grads) override;
  void scale_own(float* grads, float s) override;
  void before_collective() override { stream_wait(comm_stream_, nullptr); }  // after the compute queued so far
  void gathered(int b) override { event_record(gathered_[size_t(b)], comm_stream_); }
  void reductions_done() override;
  // Step 3 on the device, into the working copy `working` (element 0 at flat offset own_begin).
  void adamw_on_device(__nv_bfloat16* working, const float* grads, float lr, int64_t t);
  // --offload-optimizer: step 3 on the host (above), into the working copy `working` (element 0
  // at flat offset own_begin).
  void step_on_host(__nv_bfloat16* working, const float* grads, float lr, int64_t t);
  // --offload-optimizer: the host's master weights rounded to bf16 into `working` (as above).
  void upload_working_weights(__nv_bfloat16* working);
  // Where this rank's range of the bf16 working copy is: in params (stages 0-2), or the shard.
  __nv_bfloat16* own_working(__nv_bfloat16* params) { return stage() == 3 ? shard_bf16_.data() : params + own_begin_; }
  // Elements the offloaded step moves per window (16 MiB of fp32 staging on the host).
  static constexpr size_t kHostWindow = size_t(1) << 22;
  // Step 4 (above): the working copy all-gathered block by block, each followed by an event; `when`
  // ends the collectives' names in fault reports.
  void gather_working_copy(__nv_bfloat16* params, const std::string& when);
  // This rank's part of the summed gradient, element 0 at flat offset own_begin: in grads, or the
  // fp32 shard of stages 2 and 3 (null where the shard is bf16: shard_grads_bf16_).
  float* own_grads(float* grads) { return stage() >= 2 ? shard_grads_.data() : grads + own_begin_; }
  // Stages 2, 3 with --grad-reduce-dtype bf16 keep the gradient shard in bf16 (grad_shard.h).
  bool bf16_shard() const { return wire_bf16_ && stage() >= 2; }

  std::vector<AdamW::Range> pieces_;           // tensor pieces of [own_begin_, own_end_)
  AdamWConfig cfg_;
  bool wire_bf16_;                             // --grad-reduce-dtype bf16
  std::vector<DeviceEvent> gathered_;          // stages 1, 2: per block, after its all-gather
  bool gathers_pending_ = false;               // issued by step(), not waited for by the host
  bool compute_waits_gathers_ = false;         // a stream waits for them (wait_for_weights)
  DeviceBuffer<float> master_, m_, v_;         // (own_end_ - own_begin_); empty when offloaded
  AdamW* host_adam_ = nullptr;                 // --offload-optimizer: the host's AdamW (its m, v)
  float* host_master_ = nullptr;               // and its fp32 shard of the weights
  DeviceBuffer<double> sq_, sq_scratch_;
  cudaStream_t comm_stream_ = nullptr;
  std::unique_ptr<DeviceZeroComm> zc_;         // null for one rank
  DeviceBuffer<__nv_bfloat16> shard_bf16_;     // stage 3: (own_end_ - own_begin_)
  DeviceBuffer<float> shard_grads_;            // stages 2, 3: (own_end_ - own_begin_), fp32
  DeviceBuffer<__nv_bfloat16> shard_grads_bf16_;  // or bf16 (--grad-reduce-dtype bf16)
  std::unique_ptr<DeviceZeroBlocks> blocks_;   // stages 2, 3
};

LT_CUDA_NAMESPACE_END
