// One rank's model, gradients and ZeRO optimizer state on one device, as the trainer drives them.
// The trainer's step, loop, evaluation and checkpoints call only this interface: which device runs
// the passes (the CPU, a GPU, the CUDA simulator) and what the ZeRO stage shards are decided once,
// when the engine is made (make_cpu_engine, make_device_engine), never at a call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "llamatrain/checkpoint.h"
#include "llamatrain/device.h"
#include "llamatrain/model.h"
#include "llamatrain/zero.h"

namespace lt {

// What a step's update returns.
struct StepResult {
  double loss_sum = 0;   // the summed loss of this rank's micro-batches of the step
  double grad_norm = 0;  // the global gradient norm, before clipping
};

// What an engine has done since it was made; a step's share is the difference of two readings.
struct EngineCounters {
  DeviceCallCounts device_calls;  // the device runtime's calls (zeros on the CPU)
  CommVolume comm;                // ring volume of the ZeRO collectives
  // Seconds the collectives inside the passes took (ZeRO 2 and 3 on the CPU, waits for slower ranks
  // included), which a rank's compute time leaves out; 0 where the passes do not wait for them.
  double pass_comm_s = 0;
};

// Forward passes of a model whose weights do not change (eval): what an engine does without an
// optimizer, so it holds only the working weights and one batch's activations.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // The summed masked cross-entropy of b; with token_losses, each token's loss too (b.B * b.T).
  virtual double forward(const Batch& b, float* token_losses = nullptr) = 0;
  virtual std::string description() const = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // ---- a training step: begin_step, forward_backward per micro-batch (idle_round for a round
  // without one), finish_step ----
  // Gradients to zero; `step` (1-based) is the step the collectives belong to, named in fault reports.
  virtual void begin_step(int64_t step) = 0;
  // Forward and backward of one micro-batch: gradients += dloss * d(summed masked loss). `last`:
  // this rank's last micro-batch of the step (a device overlaps the gradient reduction with its
  // backward, and returns once its compute has run, so the time measured is the device's).
  virtual void forward_backward(const Batch& b, float dloss, bool last) = 0;
  // A round of micro-batches the other ranks compute and this rank has none of: joins their
  // collectives (ZeRO 2 and 3's gathers and reductions, with zero gradients); nothing otherwise.
  virtual void idle_round() = 0;
  // Reduces the gradients across ranks, clips them to max_norm (none when <= 0) and runs AdamW at
  // lr as optimizer step `step` (1-based); returns the loss summed since begin_step and the norm.
  virtual StepResult finish_step(float lr, float max_norm, int64_t step) = 0;
  // Where the CPU's passes spend their time (op families), until called with nullptr; a device
  // does not measure it.
  virtual void set_op_times(OpTimes* times) {}

  // ---- evaluation ----
  // The summed masked cross-entropy of a batch (no gradients).
  virtual double forward(const Batch& b) = 0;
  // An evaluation round without a batch on this rank: forward's collectives (ZeRO 3's gathers).
  virtual void idle_forward() = 0;

  // ---- the host's state: what checkpoints and the final model read ----
  // The host's weights and Adam state (TrainModel's model and zero) are the truth now, after a
  // start or a resume wrote them: a device takes its copy from them.
  virtual void load_host_state() = 0;
  // The weights and Adam m, v of rank `rank`'s shard on the host (copied from the device first
  // where there is one), as a checkpoint reads them.
  virtual ShardView host_state(int rank) = 0;
  // The weights for the final model on the host: the whole weights in model.params() on every
  // rank, or this rank's shard in zero.shard_params() where the host holds only that.
  virtual void gather_weights() = 0;

  // ---- what it is and what it used ----
  virtual DeviceInfo info() = 0;  // measures the matrix-product rate (a short benchmark)
  virtual std::string description() const = 0;  // e.g. "NVIDIA H100 80GB HBM3 (GPU 1 of 4)"
  // Bytes of the activation buffers for b rows of T tokens.
  virtual size_t activation_bytes(int b, int T) const = 0;
  virtual EngineCounters counters() = 0;
  virtual DeviceMemoryUse memory_use() { return {}; }  // zeros where the device does not track it
  // The most bytes of bf16 weight and operand copies held so far (the CPU's --precision bf16).
  virtual size_t bf16_copy_peak_bytes() const { return 0; }
};

// Whether the host keeps only this rank's shard of the weights for an engine on `device` at
// `zero_stage` (ZeroOptimizer::sharded_params; with LoRA, FrozenShards for the base): ZeRO 3, and
// on a device every stage above 0 (the device holds the working copy; the host needs only what
// checkpoints and the final model read of this rank's shard). LoRA's base is whole below ZeRO 3.
// Where it does, the weights are made in zero.hold_shard_params() (or the FrozenShards) before the
// engine; else in model.params(), padded to zero.padded_size().
bool host_holds_only_shard(DeviceKind device, int zero_stage, bool lora);

// The CPU engine: `model`'s passes on this process's cores, the ZeRO optimizer on host buffers
// (zero.h; stages 2 and 3 reduce gradients and gather weights inside the passes). LoRA at ZeRO 3:
// frozen_base, the base's shards, which the passes gather (zero is the adapters' optimizer). Makes
// the gradients' host buffers its stage needs: whole, or zero's shard and blocks (ZeRO 2, 3); with
// LoRA, the adapters' (model.lora_grads()) are the caller's.
std::unique_ptr<Engine> make_cpu_engine(Llama2Model& model, ZeroOptimizer& zero, FrozenShards* frozen_base = nullptr);
// An accelerator's engine: make_device_engine (device.h) of a registered backend.

// The CPU's evaluator: `model`'s forward on this process's cores.
std::unique_ptr<Evaluator> make_cpu_evaluator(Llama2Model& model);
// `model`'s weights on `kind` (the CPU: the model itself; a device: a copy in its memory, after
// which the host's may be freed); local_rank picks the GPU among the node's.
std::unique_ptr<Evaluator> make_evaluator(DeviceKind kind, Llama2Model& model, int local_rank);
// A decoder (inference.h) of `model` on `kind` (the CPU: CpuDecoder over the model's weights; a
// device: its own copy), caching max_len positions.
std::unique_ptr<Decoder> make_decoder(DeviceKind kind, const Llama2Model& model, int max_len, int local_rank);

// The step of the host's optimizer (zero.h) over what `model` trains (its adapters with LoRA, else
// its weights; what zero holds where the host holds only shards): reduce the gradients across ranks,
// clip them to max_norm, AdamW at lr as step `step`; returns the norm before clipping. The CPU
// engine's update, and a device's LoRA adapters' (their gradients copied to the host first).
double host_optimizer_step(Llama2Model& model, ZeroOptimizer& zero, float lr, float max_norm, int64_t step);
// LoRA's dropout stream of a micro-batch: one mask per (step, rank, micro-batch of the step), the same
// in a rerun of the step and on every device.
uint64_t lora_dropout_stream(int64_t step, int rank, int micro);

// Rank `rank`'s shard of the host's weights (zero's shard where the host holds only that, else
// model's whole params; with LoRA the adapters) and of zero's Adam m, v: what every engine's
// host_state returns.
ShardView host_shard_view(Llama2Model& model, ZeroOptimizer& zero, int rank);

}  // namespace lt
