// The device communicator of --device cuda-sim (see device_comm.h): the simulator's device memory
// is host memory, so the host communicator (MPI) reduces and gathers it directly. Compiled only
// for the simulator build.
//
// A collective is an operation on its stream (kernels/sim/stream_sim.h) that runs at its point of
// issue: the stream is run up to and including it (so the work it waits for runs first, and work
// it does not wait for may still be queued: a missing wait changes the sums), then MPI is called.
// Deferring it to a later synchronisation point instead would let ranks reach their host
// collectives (the clipping norm's allreduce on the same communicator) with device collectives in
// different states, and MPI would match one rank's device sum with another's host sum. At issue,
// every rank makes its MPI calls in program order, which is the same on every rank.
#include "backend/cuda/device_comm.h"

#include "sim/stream_sim.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

sim::Access reads_writes(const void* p, size_t bytes) {
  sim::Access a;
  a.reads = a.writes = {sim::Range{p, bytes}};
  return a;
}

class HostDeviceComm final : public DeviceComm {
 public:
  HostDeviceComm(Comm& host, cudaStream_t stream) : host_(host), stream_(stream) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name(); }
  void allreduce_sum(float* buf, size_t count) override {
    sim::run_in_order(stream_, "allreduce", reads_writes(buf, count * sizeof(float)),
                      [=] { host_.allreduce_sum(buf, count, DType::kF32); });
  }
  void reduce_sum(float* buf, size_t count, int root) override {
    sim::run_in_order(stream_, "reduce", reads_writes(buf, count * sizeof(float)),
                      [=] { host_.reduce_sum(buf, count, DType::kF32, root); });
  }
  void allgather(__nv_bfloat16* buf, size_t shard_count) override {
    sim::run_in_order(stream_, "allgather", reads_writes(buf, size_t(size()) * shard_count * sizeof(*buf)),
                      [=] { host_.allgather(buf, shard_count, DType::kBF16); });
  }
  void group_begin() override {}
  void group_end() override {}

 private:
  Comm& host_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<DeviceComm> make_device_comm(Comm& host, cudaStream_t stream) {
  return std::make_unique<HostDeviceComm>(host, stream);
}

LT_CUDA_NAMESPACE_END
