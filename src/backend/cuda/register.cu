// The CUDA backend as an lt::Engine (include/llamatrain/engine.h), registered with the device
// registry (include/llamatrain/device.h) by an extern "C" function whose name carries the build:
// llamatrain_register_gpu_backend (nvcc) and llamatrain_register_simulated_backend (simulator),
// called from main().
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "backend/cuda/cuda_decoder.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/pass_ops.h"
#include "llamatrain/device.h"
#include "llamatrain/engine.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

// The device's bf16 GEMM rate through the backend's own matmul (gemm_benchmark: one warm-up,
// then the best of a few).
double measure_gemm_tflops() {
  const GemmBenchmark g = gemm_benchmark();
  const int n = g.n;
  DeviceBuffer<__nv_bfloat16> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  device_memset(a.data(), 0x3c, a.size() * sizeof(__nv_bfloat16));  // 0x3c3c: about 0.0115
  device_memset(b.data(), 0x3c, b.size() * sizeof(__nv_bfloat16));
  matmul_forward(c.data(), a.data(), b.data(), n, n, n, nullptr);
  device_synchronize();
  double best = 1e30;
  for (int r = 0; r < g.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul_forward(c.data(), a.data(), b.data(), n, n, n, nullptr);
    device_synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best / 1e12;
}

DeviceCallCounts call_counts() {
  const DeviceCounters c = device_counters();
  DeviceCallCounts d;
  d.allocs = double(c.allocs);
  d.frees = double(c.frees);
  d.device_syncs = double(c.device_syncs);
  d.stream_syncs = double(c.stream_syncs);
  d.h2d_copies = double(c.h2d_copies);
  d.d2h_copies = double(c.d2h_copies);
  d.blocking_copies = double(c.blocking_copies);
  d.plans_built = double(c.plans_built);
  return d;
}

// What both CUDA engines share: the device's CudaModel made from the spec, the host's model and
// optimizer (the staging of checkpoints), and what the device is and used.
class CudaEngineBase : public Engine {
 public:
  CudaEngineBase(const DeviceEngineSpec& spec, Llama2Model& host_model, ZeroOptimizer& zero)
      : local_rank_(spec.local_rank), model_(spec.cfg), host_model_(host_model), zero_(zero) {
    model_.set_attention(spec.attention);
    model_.set_collectives(spec.collectives);
    model_.set_recompute(spec.recompute);
  }

  // The device's properties and measured product rate.
  DeviceInfo info() override {
    const DeviceProperties p = device_properties();
    DeviceInfo d;
    d.name = description();
    d.sm_count = p.sm_count;
    d.memory_bytes = p.memory_bytes;
    d.cc_major = p.cc_major;
    d.cc_minor = p.cc_minor;
    d.gemm_tflops = measure_gemm_tflops();
    d.gemm_what = gemm_benchmark().what;
    d.peak_tflops = device_peak_tflops(&d.peak_what);
    return d;
  }
  std::string description() const override { return device_label(local_rank_); }
  size_t activation_bytes(int B, int Tn) const override { return model_.activation_bytes(B, Tn); }
  DeviceMemoryUse memory_use() override {
    const DeviceMemoryStats s = device_memory_stats();
    DeviceMemoryUse u;
    u.allocated_bytes = double(s.allocated_bytes);
    u.peak_bytes = double(s.peak_bytes);
    u.driver_used_peak_bytes = double(s.driver_used_peak);
    return u;
  }

 protected:
  int local_rank_;
  CudaModel model_;
  Llama2Model& host_model_;
  ZeroOptimizer& zero_;
};

// The CUDA engine: CudaModel runs the passes and the ZeRO optimizer on device buffers (DeviceZero),
// the gradient reduction overlapped with the last micro-batch's backward; the host's model params
// (or zero's shard) and zero's Adam m, v are only the staging copy checkpoints and the final model
// read.
class CudaEngine final : public CudaEngineBase {
 public:
  using CudaEngineBase::CudaEngineBase;

  void begin_step(int64_t step) override {
    model_.set_step(step);
    model_.clear_grads();
  }

  // The losses stay on the device until finish_step reads them at once.
  void forward_backward(const Batch& b, float dloss, bool last) override {
    model_.forward_deferred(b);
    if (!last) return model_.backward(b, dloss);
    model_.backward_last(b, dloss);  // also reduces each layer's gradients as backward finishes them
    model_.finish_compute();         // the device's compute time, not the time to queue it
  }

  void idle_round() override {
    if (zero_.stage() < 2) return;  // ZeRO 0 and 1 reduce once, after the passes
    model_.idle_forward();
    model_.idle_backward();
  }

  StepResult finish_step(float lr, float max_norm, int64_t step) override {
    StepResult r;
    r.grad_norm = model_.reduce_and_clip_grads(max_norm);
    model_.optimizer_step(lr, step);
    r.loss_sum = model_.take_loss_sum();  // the step's one read of its losses: waits for the update
    return r;
  }

  double forward(const Batch& b) override { return model_.forward(b); }
  void idle_forward() override {
    if (zero_.stage() == 3) model_.idle_forward();  // only ZeRO 3's forward gathers
  }

  void load_host_state() override { model_.init_optimizer(zero_, host_model_.params().data()); }
  ShardView host_state(int rank) override {
    model_.optimizer_state_to_host(zero_, host_model_.params().data());
    return host_shard_view(host_model_, zero_, rank);
  }
  void gather_weights() override {
    // Where the host holds only this rank's shard, the final model streams the shards (trainer.cpp).
    model_.optimizer_state_to_host(zero_, zero_.sharded_params() ? nullptr : host_model_.params().data());
  }

  EngineCounters counters() override {
    EngineCounters c;
    c.device_calls = call_counts();
    c.comm = model_.comm_volume();
    return c;
  }
};

// LoRA on the CUDA backend: the frozen base (bf16; whole, or at ZeRO 3 this rank's shard, which the
// passes gather a block at a time) and the adapters' bf16 working copy and fp32 gradients on the
// device, the adapters' products by the same cuBLASLt calls as the base's. Their optimizer is the
// host's, the CPU engine's (zero: stage 0 or 1 over the adapters' table, MPI on host buffers): once
// a step their gradients are copied down, reduced, clipped and updated there, and the adapters
// copied up in bf16. They are 0.1-2% of the model, so this moves megabytes a step where DeviceZero's
// buckets and overlap would buy nothing, and the host's model and zero stay the checkpoints' truth.
class CudaLoraEngine final : public CudaEngineBase {
 public:
  CudaLoraEngine(const DeviceEngineSpec& spec, Llama2Model& host_model, ZeroOptimizer& zero)
      : CudaEngineBase(spec, host_model, zero), frozen_(spec.frozen_base) {
    LT_CHECK(host_model.lora(), "CudaLoraEngine without adapters");
    model_.enable_lora(*host_model.lora());
  }

  void begin_step(int64_t step) override {
    model_.clear_lora_grads();
    step_ = step;
    micro_ = 0;
  }

  void forward_backward(const Batch& b, float dloss, bool last) override {
    model_.set_lora_dropout_stream(lora_dropout_stream(step_, zero_.comm().rank(), micro_++));
    model_.forward_deferred(b);
    model_.backward(b, dloss);
    if (last) model_.finish_compute();  // the device's compute time, not the time to queue it
  }

  void idle_round() override {
    if (!frozen_) return;  // only ZeRO 3's frozen base is gathered inside the passes
    model_.idle_forward();
    model_.idle_backward();
  }

  StepResult finish_step(float lr, float max_norm, int64_t step) override {
    model_.lora_grads_to_host(host_model_.lora_grads().data());
    StepResult r;
    r.grad_norm = host_optimizer_step(host_model_, zero_, lr, max_norm, step);
    model_.set_lora_params(host_model_.lora_params().data());
    r.loss_sum = model_.take_loss_sum();
    return r;
  }

  double forward(const Batch& b) override {
    model_.set_lora_dropout_stream(0);  // evaluation: no dropout
    return model_.forward(b);
  }
  void idle_forward() override {
    if (frozen_) model_.idle_forward();
  }

  void load_host_state() override {
    if (frozen_) model_.set_frozen_shards(frozen_->params().data(), frozen_->shards(), zero_.comm());
    else model_.set_params(host_model_.params().data());
    model_.set_lora_params(host_model_.lora_params().data());
  }
  // The host's adapters and their Adam state are the truth after every step.
  ShardView host_state(int rank) override { return host_shard_view(host_model_, zero_, rank); }
  void gather_weights() override {}

  EngineCounters counters() override {
    EngineCounters c;
    c.device_calls = call_counts();
    c.comm = zero_.volume();
    c.comm.allgather += model_.frozen_volume().allgather;
    return c;
  }

 private:
  FrozenShards* frozen_;  // ZeRO 3: the host's shards of the base; else null
  int64_t step_ = 0;
  int micro_ = 0;  // this step's micro-batches so far
};

// Forward passes only: the bf16 working weights (and LoRA adapters, without dropout) and one batch's
// activations on the device.
class CudaEvaluator final : public Evaluator {
 public:
  CudaEvaluator(const Llama2Model& host, int local_rank) : local_rank_(local_rank), model_(host.config()) {
    model_.set_params(host.params().data());
    if (!host.lora()) return;
    model_.enable_lora(*host.lora());
    model_.set_lora_params(host.lora_params().data());
  }
  double forward(const Batch& b, float* token_losses) override { return model_.forward(b, token_losses); }
  std::string description() const override { return device_label(local_rank_); }

 private:
  int local_rank_;
  CudaModel model_;
};

std::unique_ptr<Evaluator> make_evaluator(const Llama2Model& model, int local_rank) {
  select_device(local_rank);
  return std::make_unique<CudaEvaluator>(model, local_rank);
}

std::unique_ptr<Decoder> make_decoder(const Llama2Model& model, int max_len, int local_rank) {
  select_device(local_rank);
  return std::make_unique<CudaDecoder>(model, max_len);
}

std::unique_ptr<Engine> make_engine(const DeviceEngineSpec& spec, Llama2Model& model, ZeroOptimizer& zero) {
  select_device(spec.local_rank);
  if (model.lora()) return std::make_unique<CudaLoraEngine>(spec, model, zero);
  return std::make_unique<CudaEngine>(spec, model, zero);
}

}  // namespace
LT_CUDA_NAMESPACE_END

#define LT_REGISTER_NAME_(flavour) llamatrain_register_##flavour##_backend
#define LT_REGISTER_NAME(flavour) LT_REGISTER_NAME_(flavour)

extern "C" void LT_REGISTER_NAME(LT_CUDA_FLAVOR)() {
  lt::DeviceBackend b;
  b.kind = lt::cuda::simulated() ? lt::DeviceKind::cuda_sim : lt::DeviceKind::cuda;
  b.make_engine = &lt::cuda::make_engine;
  b.make_evaluator = &lt::cuda::make_evaluator;
  b.make_decoder = &lt::cuda::make_decoder;
  b.device_count = &lt::cuda::device_count;
  b.report = &lt::cuda::runtime_report;
  lt::register_device_backend(b);
}
