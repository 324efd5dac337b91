// The CUDA backend as an lt::DeviceModel, registered with the device registry
// (include/llamatrain/device.h) by an extern "C" function whose name carries the build:
// llamatrain_register_gpu_backend (nvcc) and llamatrain_register_simulated_backend (simulator),
// called from main().
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/pass_ops.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/gpu_spec.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

class RegisteredModel final : public DeviceModel {
 public:
  RegisteredModel(const Llama2Config& cfg, int local_rank) : local_rank_(local_rank), model_(cfg) {}
  void zero_grads() override { model_.zero_grads(); }
  double forward(const Batch& b) override { return model_.forward(b); }
  void forward_deferred(const Batch& b) override { model_.forward_deferred(b); }
  double take_loss_sum() override { return model_.take_loss_sum(); }
  void finish_compute() override { model_.finish_compute(); }
  void backward(const Batch& b, float dloss) override { model_.backward(b, dloss); }
  void zero_init(ZeroOptimizer& host, const float* params) override { model_.zero_init(host, params); }
  void backward_last(const Batch& b, float dloss) override { model_.backward_last(b, dloss); }
  double zero_reduce_and_clip(float max_norm) override { return model_.zero_reduce_and_clip(max_norm); }
  void zero_step(float lr, int64_t t) override { model_.zero_step(lr, t); }
  void set_collectives(const DeviceCollectives& c) override { model_.set_collectives(c); }
  void set_step(int64_t step) override { model_.set_step(step); }
  void zero_state_to_host(ZeroOptimizer& host, float* params) override { model_.zero_state_to_host(host, params); }
  void zero_idle_forward() override { model_.zero_idle_forward(); }
  void zero_idle_backward() override { model_.zero_idle_backward(); }
  void set_attention(const std::string& name) override {
    if (name == "native") return model_.set_attention(Attention::kNative);
    if (name != "cudnn") fail(strcat("--attention ", name, ": expected native or cudnn"));
    if (simulated())
      fail("--attention cudnn runs only on a GPU (--device cuda): cuDNN is not available in the CUDA simulator "
           "(--device cuda-sim); use --attention native there");
    model_.set_attention(Attention::kCudnn);
  }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }
  size_t activation_bytes(int B, int Tn) const override { return model_.activation_bytes(B, Tn); }
  DeviceInfo info() override {
    const DeviceProperties p = device_properties();
    DeviceInfo d;
    d.name = description();
    d.sm_count = p.sm_count;
    d.memory_bytes = p.memory_bytes;
    d.cc_major = p.cc_major;
    d.cc_minor = p.cc_minor;
    // bf16 GEMM rate through the backend's own matmul: 4096^3 on a GPU (about 1 ms on an A100),
    // 256^3 on the simulator (its CPU BLAS path); one warm-up, then the best of a few.
    const int n = simulated() ? 256 : 4096, reps = simulated() ? 3 : 10;
    DeviceBuffer<__nv_bfloat16> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
    device_memset(a.data(), 0x3c, a.size() * sizeof(__nv_bfloat16));  // 0x3c3c: about 0.0115
    device_memset(b.data(), 0x3c, b.size() * sizeof(__nv_bfloat16));
    matmul_forward(c.data(), a.data(), b.data(), n, n, n, nullptr);
    device_synchronize();
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      matmul_forward(c.data(), a.data(), b.data(), n, n, n, nullptr);
      device_synchronize();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    d.gemm_tflops = 2.0 * n * n * n / best / 1e12;
    d.gemm_what = strcat("bf16 ", n, "^3 ", simulated() ? "CPU BLAS (simulator)" : "cuBLASLt");
    // A GPU's peak is its datasheet's; the simulator's is its host's (TrainModel::device_info).
    if (!simulated())
      if (const GpuSpec* spec = gpu_spec_for_device(device_description(), p.memory_bytes)) {
        d.peak_tflops = spec->bf16_tflops;
        d.peak_what = strcat(spec->name, " datasheet dense bf16");
      }
    return d;
  }
  DeviceMemoryUse memory_use() override {
    const DeviceMemoryStats s = device_memory_stats();
    DeviceMemoryUse u;
    u.allocated_bytes = double(s.allocated_bytes);
    u.peak_bytes = double(s.peak_bytes);
    u.driver_used_peak_bytes = double(s.driver_used_peak);
    return u;
  }
  CommVolume comm_volume() override { return model_.comm_volume(); }
  DeviceCallCounts call_counts() override {
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
  std::string description() const override {
    if (simulated()) return device_description();
    return strcat(device_description(), " (GPU ", local_rank_ % device_count(), " of ", device_count(), ")");
  }

 private:
  int local_rank_;
  CudaModel model_;
};

std::unique_ptr<DeviceModel> make_model(const Llama2Config& cfg, int local_rank) {
  select_device(local_rank);
  return std::make_unique<RegisteredModel>(cfg, local_rank);
}

}  // namespace
LT_CUDA_NAMESPACE_END

#define LT_REGISTER_NAME_(flavour) llamatrain_register_##flavour##_backend
#define LT_REGISTER_NAME(flavour) LT_REGISTER_NAME_(flavour)

extern "C" void LT_REGISTER_NAME(LT_CUDA_FLAVOR)() {
  lt::DeviceBackend b;
  b.kind = lt::cuda::simulated() ? lt::DeviceKind::cuda_sim : lt::DeviceKind::cuda;
  b.make = &lt::cuda::make_model;
  b.device_count = &lt::cuda::device_count;
  b.report = &lt::cuda::runtime_report;
  lt::register_device_backend(b);
}
