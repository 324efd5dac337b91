// The device communicator of --device cuda-sim (see device_comm.h): the simulator's device memory
// is host memory, so the host communicator (MPI) reduces and gathers it directly. Compiled only
// for the simulator build.
#include "backend/cuda/device_comm.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

class HostDeviceComm final : public DeviceComm {
 public:
  explicit HostDeviceComm(Comm& host) : host_(host) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name(); }
  void allreduce_sum(float* buf, size_t count) override { host_.allreduce_sum(buf, count, DType::kF32); }
  void reduce_sum(float* buf, size_t count, int root) override { host_.reduce_sum(buf, count, DType::kF32, root); }
  void allgather(__nv_bfloat16* buf, size_t shard_count) override {
    host_.allgather(buf, shard_count, DType::kBF16);
  }
  void group_begin() override {}
  void group_end() override {}

 private:
  Comm& host_;
};

}  // namespace

std::unique_ptr<DeviceComm> make_device_comm(Comm& host, cudaStream_t) {
  return std::make_unique<HostDeviceComm>(host);
}

LT_CUDA_NAMESPACE_END
