// The CUDA backend as an lt::DeviceModel, registered with the device registry
// (include/llamatrain/device.h) by an extern "C" function whose name carries the build:
// llamatrain_register_gpu_backend (nvcc) and llamatrain_register_simulated_backend (simulator),
// called from main().
#include <memory>
#include <string>

#include "backend/cuda/cuda_model.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

class RegisteredModel final : public DeviceModel {
 public:
  RegisteredModel(const Llama2Config& cfg, int local_rank) : local_rank_(local_rank), model_(cfg) {}
  void set_params(const float* host) override { model_.set_params(host); }
  void zero_grads() override { model_.zero_grads(); }
  double forward(const Batch& b) override { return model_.forward(b); }
  void backward(const Batch& b, float dloss) override { model_.backward(b, dloss); }
  void grads_to_host(float* host) override { model_.grads_to_host(host); }
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
  lt::register_device_backend(b);
}
