// Llama 2 on the CUDA backend: bf16 working weights and activations and fp32 gradients in device
// memory, run by the shared forward/backward pass (src/model/llama2_pass.h) over the CUDA op
// policy (pass_ops.h). Batches come from the host; their ids are checked, then copied to the
// device. Compiled in both builds (see device.h): lt::cuda::CudaModel is the GPU one under nvcc
// and the simulated one (--device cuda-sim) otherwise.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/cuda/device.h"
#include "backend/cuda/device_zero.h"
#include "backend/cuda/upload_staging.h"
#include "llamatrain/comm_wait.h"
#include "llamatrain/config.h"
#include "llamatrain/model.h"

namespace lt {
template <class Ops>
class Llama2Pass;
}

LT_CUDA_NAMESPACE_BEGIN

struct PassOps;

class CudaModel {
 public:
  explicit CudaModel(const Llama2Config& cfg);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const Llama2Config& config() const { return cfg_; }
  const ParameterLayout& layout() const { return layout_; }

  // The bf16 working copy from fp32 host weights (layout().total()), rounded to nearest even.
  void set_params(const float* host);
  void clear_grads();
  // Forward with loss: the summed masked cross-entropy (0 without targets); per-token losses
  // (B*T, fp32) to the host when token_losses is given.
  double forward(const Batch& host_batch, float* token_losses = nullptr);
  // forward() of a training step's micro-batch: its summed loss stays on the device, and
  // take_loss_sum() reads the losses of every forward_deferred() since the last call at once (one
  // copy to the host per step instead of one per micro-batch), summed in call order.
  void forward_deferred(const Batch& host_batch);
  double take_loss_sum();
  // Waits for the compute stream (the forward and backward work queued so far).
  void finish_compute() { stream_synchronize(ops_stream()); }
  // Backward of (dloss * summed loss) after forward() on the same batch: += into the gradients.
  void backward(const Batch& host_batch, float dloss);
  // Our attention kernel (the default) or cuDNN's (Attention::kCudnn: loads cuDNN now and throws if it
  // cannot be used; the simulator build always throws). With cuDNN, forward() refuses batches that
  // pack several examples into a row (a seg_start > 0), which cuDNN cannot mask.
  void set_attention(Attention attention);
  // fp32 gradients (layout().total()) to the host.
  void grads_to_host(float* host) const;

  // The optimizer on the device (device_zero.h), made from the host's ZeroOptimizer: the
  // parameter and gradient buffers are padded to its shards, the fp32 master weights and Adam
  // state of this rank's range come from params (padded flat) and host.adamw(), and the bf16
  // working copy from all of params.
  // comm: see DeviceZero (null: over host.comm(), waiting at most set_collectives()'s timeout).
  // Where the host holds only its shard (host.sharded_params(): ZeRO 3, and 1-2 as train runs
  // them) params is not read: the state comes from host.shard_params(); ZeRO 3 then keeps only
  // shards on the device (device_zero.h), 1 and 2 all-gather the bf16 working copy there.
  void init_optimizer(ZeroOptimizer& host, const float* params, std::unique_ptr<DeviceComm> comm = nullptr);
  // Stages 2 and 3: the gathers (stage 3) and reductions of zero gradients of a forward and
  // backward this rank has no batch for, in a round the others compute (zero_blocks.h
  // idle_forward_blocks).
  // With LoRA at ZeRO 3, the frozen shards' gathers of such a round.
  void idle_forward();
  void idle_backward();
  // How the optimizer made by init_optimizer runs its collectives: how long the device communicator
  // waits for one before it aborts (train --comm-timeout) and the gradient bucket size
  // (--bucket-mb). Set before init_optimizer.
  void set_collectives(const DeviceCollectives& c) { collectives_ = c; }
  // The 1-based optimizer step the next collectives belong to, named in fault reports.
  void set_step(int64_t step);
  // backward() of a step's last micro-batch: the gradient buckets are reduced across ranks as the
  // pass finishes them.
  void backward_last(const Batch& host_batch, float dloss);
  // Completes the reduction, clips; returns the global gradient norm before clipping.
  double reduce_and_clip_grads(float max_norm);
  void optimizer_step(float lr, int64_t t);
  // A shard-only host (host.sharded_params()): into host.shard_params() (params is not written).
  void optimizer_state_to_host(ZeroOptimizer& host, float* params) const;
  // The fp32 gradient buffer (device memory, padded flat; ZeRO 0, 1), for tests.
  const float* device_grads() const { return grads_.data(); }
  // The bf16 working weights (device memory, padded flat; ZeRO 0-2), for tests.
  const __nv_bfloat16* device_params() const { return params_.data(); }
  // The ring volume of the device optimizer's collectives so far (none before init_optimizer).
  CommVolume comm_volume() const;
  // The stream the device communicator runs on after init_optimizer (null before, and for one rank), for
  // tests whose own communicator reads the gradients as its collectives would.
  cudaStream_t device_comm_stream() const;
  // The last forward()'s logits (B*T, V) to the host as fp32; valid until backward().
  void logits_to_host(float* host) const;
  // LoRA (lora.h): the adapters of `lora` on a frozen base, whose bf16 weights come from
  // set_params (whole) or set_frozen_shards (ZeRO 3). backward() then computes no gradient of the
  // base, only the adapters' (fp32, +=), and nothing here updates anything: the adapters' optimizer
  // is the host's (register.cu).
  void enable_lora(const LoraLayout& lora);
  void set_lora_params(const float* host);       // the adapters' bf16 working copy (lora.total() fp32)
  void clear_lora_grads();
  void lora_grads_to_host(float* host) const;    // lora.total() fp32
  // The dropout mask's stream of the next passes (llama2_pass.h); 0: no dropout (evaluation).
  void set_lora_dropout_stream(uint64_t stream) { lora_stream_ = stream; }
  // LoRA at ZeRO 3: the frozen base as this rank's shard (own: fp32, element 0 at shards.begin of
  // this rank), which the passes gather a block at a time over comm; no whole copy is allocated.
  void set_frozen_shards(const float* own, const ShardLayout& shards, Comm& comm);
  // Bytes the frozen shards' gathers sent so far.
  CommVolume frozen_volume() const;
  // Activation recomputation (src/model/llama2_pass.h); default kNone.
  void set_recompute(Recompute r);
  // Bytes of the device activation buffers for B rows of Tn tokens in the current mode.
  size_t activation_bytes(int B, int Tn) const;

 private:
  cudaStream_t ops_stream() const;
  // What the passes read weights (and write gradients) through: ZeRO 2 and 3's blocks, the frozen
  // base's shards, or null (the flat buffers).
  ParamBlocks<__nv_bfloat16, float>* pass_blocks();
  void set_settle_hook();
  Batch upload(const Batch& host_batch);
  double run_forward(const Batch& host_batch);
  void run_backward(const Batch& host_batch, float dloss);

  Llama2Config cfg_;
  ParameterLayout layout_;
  DeviceBuffer<__nv_bfloat16> params_;
  DeviceBuffer<float> grads_;
  std::unique_ptr<PassOps> ops_;
  std::unique_ptr<Llama2Pass<PassOps>> pass_;
  // Batches are uploaded from pinned staging on their own stream (upload()), into two device slots
  // used in turn, so the copy of a batch waits only for the passes over the batch two uploads
  // back (`released`, recorded on the compute stream after them), and the compute stream waits
  // for the copy (`copied`).
  struct BatchSlot {
    DeviceBuffer<uint8_t> data;  // the batch's arrays, packed (BatchArraysLayout in cuda_model.cu)
    DeviceEvent copied = nullptr, released = nullptr;
  };
  cudaStream_t copy_stream_ = nullptr;
  UploadStaging batch_staging_;
  BatchSlot slots_[2];
  int next_slot_ = 0;
  BatchSlot* batch_slot_ = nullptr;  // the last forward()'s
  Batch device_batch_;  // the last forward()'s batch on the device, reused by backward()
  int batch_rows_ = 0;  // B*T of the last forward()
  // forward_deferred()'s losses, one double per micro-batch, and what earlier reads summed.
  DeviceBuffer<double> loss_slots_;
  size_t pending_losses_ = 0;
  double loss_carry_ = 0;
  std::unique_ptr<DeviceZero> zero_;
  bool sets_host_wait_hook_ = false;  // init_optimizer set the runtime's hook to zero_->settle()
  DeviceCollectives collectives_;
  const LoraLayout* lora_ = nullptr;       // enable_lora
  DeviceBuffer<__nv_bfloat16> lora_params_;
  DeviceBuffer<float> lora_grads_;
  uint64_t lora_stream_ = 0;
  std::unique_ptr<DeviceFrozenShards> frozen_;  // LoRA at ZeRO 3
};

LT_CUDA_NAMESPACE_END
