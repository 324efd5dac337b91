// An accelerator's engine: a DeviceModel (the CUDA backend on a GPU or in the simulator) runs the
// passes and the ZeRO optimizer on device buffers, with the gradient reduction overlapped with the
// last micro-batch's backward; the host keeps only the staging copy of the state that checkpoints
// and the final model read (TrainModel's model params or zero's shard, and zero's Adam m, v).
#include <omp.h>

#include "llamatrain/engine.h"

namespace lt {

namespace {

class DeviceEngine final : public Engine {
 public:
  DeviceEngine(std::unique_ptr<DeviceModel> dev, Llama2Model& model, ZeroOptimizer& zero)
      : dev_(std::move(dev)), model_(model), zero_(zero) {}

  void begin_step(int64_t step) override {
    dev_->set_step(step);
    dev_->zero_grads();
  }

  // The losses stay on the device until finish_step reads them at once.
  void forward_backward(const Batch& b, float dloss, bool last) override {
    dev_->forward_deferred(b);
    if (!last) return dev_->backward(b, dloss);
    dev_->backward_last(b, dloss);  // also reduces each layer's gradients as backward finishes them
    dev_->finish_compute();         // the device's compute time, not the time to queue it
  }

  void idle_round() override {
    if (zero_.stage() < 2) return;  // ZeRO 0 and 1 reduce once, after the passes
    dev_->zero_idle_forward();
    dev_->zero_idle_backward();
  }

  StepResult finish_step(float lr, float max_norm, int64_t step) override {
    StepResult r;
    r.grad_norm = dev_->zero_reduce_and_clip(max_norm);
    dev_->zero_step(lr, step);
    r.loss_sum = dev_->take_loss_sum();  // the step's one read of its losses: waits for the update
    return r;
  }

  double forward(const Batch& b) override { return dev_->forward(b); }

  void idle_forward() override {
    if (zero_.stage() == 3) dev_->zero_idle_forward();  // only ZeRO 3's forward gathers
  }

  void load_host_state() override { dev_->zero_init(zero_, model_.params().data()); }

  ShardView host_state(int rank) override {
    dev_->zero_state_to_host(zero_, model_.params().data());
    return host_shard_view(model_, zero_, rank);
  }

  void gather_weights() override {
    // Where the host holds only this rank's shard, the final model streams the shards (trainer.cpp).
    dev_->zero_state_to_host(zero_, zero_.sharded_params() ? nullptr : model_.params().data());
  }

  DeviceInfo info() override {
    DeviceInfo d = dev_->info();
    if (d.peak_tflops == 0 && d.sm_count == 0) {
      // The CUDA simulator computes on the host's cores: their fp32 peak.
      d.peak_tflops = host_cpu_peak_tflops(omp_get_max_threads(), &d.peak_what);
      d.peak_what = "simulator on the host CPU: " + d.peak_what;
    }
    return d;
  }

  size_t activation_bytes(int b, int T) const override { return dev_->activation_bytes(b, T); }

  EngineCounters counters() override {
    EngineCounters c;
    c.device_calls = dev_->call_counts();
    c.comm = dev_->comm_volume();
    return c;
  }

  DeviceMemoryUse memory_use() override { return dev_->memory_use(); }

 private:
  std::unique_ptr<DeviceModel> dev_;
  Llama2Model& model_;
  ZeroOptimizer& zero_;
};

}  // namespace

std::unique_ptr<Engine> make_device_engine(std::unique_ptr<DeviceModel> dev, Llama2Model& model,
                                           ZeroOptimizer& zero) {
  return std::make_unique<DeviceEngine>(std::move(dev), model, zero);
}

}  // namespace lt
