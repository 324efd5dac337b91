// The cuda-sim device communicator's fault injection (src/backend/cuda/device_comm_sim.h): the
// faulty call returns, as a GPU's would; the host's next wait, synchronize(), through the wait that
// NCCL's communicator uses (llamatrain/comm_wait.h), reaches the timeout for a hung collective and
// fails at once for an erroring one, naming the collective; the other ranks' and the other
// collectives' calls are untouched. Whole jobs under mpirun: tests/mpi/test_comm_faults_mpi.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_comm_sim.h"
#include "llamatrain/comm_wait.h"

namespace {

using lt::cuda::SimCommFault;
using Clock = std::chrono::steady_clock;

// One rank of a 2-rank world that counts its host collectives (the MPI calls the device
// communicator makes) and moves no data.
class CountingView final : public lt::Comm {
 public:
  explicit CountingView(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string name() const override { return "counting view"; }
  void allreduce_sum(void*, size_t, lt::DType) override { ++calls; }
  void reduce_scatter_sum(void*, size_t, lt::DType) override { ++calls; }
  void reduce_sum(void*, size_t, lt::DType, int) override { ++calls; }
  void allgather(void*, size_t, lt::DType) override { ++calls; }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  int calls = 0;

 private:
  int rank_;
};

std::string error_of(const std::function<void()>& f, bool* comm_fault = nullptr) {
  try {
    f();
  } catch (const lt::CommFault& e) {
    if (comm_fault) *comm_fault = true;
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

struct Rig {
  CountingView host;
  cudaStream_t stream = lt::cuda::stream_create();
  lt::cuda::DeviceBuffer<float> grads{64};
  lt::cuda::DeviceBuffer<__nv_bfloat16> weights{64};
  std::unique_ptr<lt::cuda::DeviceComm> comm;
  Rig(int rank, const std::string& fault, double timeout_s)
      : host(rank),
        comm(lt::cuda::make_sim_device_comm(host, stream, timeout_s, lt::cuda::parse_sim_comm_fault(fault))) {}
  ~Rig() {
    comm.reset();
    lt::cuda::stream_destroy(stream);
  }
};

TEST(CudaSimCommFaults, ParsesTheFaultSpec) {
  const SimCommFault none = lt::cuda::parse_sim_comm_fault("");
  EXPECT_EQ(none.kind, SimCommFault::Kind::kNone);
  const SimCommFault hang = lt::cuda::parse_sim_comm_fault("hang:allreduce:3@1");
  EXPECT_EQ(hang.kind, SimCommFault::Kind::kHang);
  EXPECT_EQ(hang.op, "allreduce");
  EXPECT_EQ(hang.n, 3);
  EXPECT_EQ(hang.rank, 1);
  const SimCommFault error = lt::cuda::parse_sim_comm_fault("error:any:1");
  EXPECT_EQ(error.kind, SimCommFault::Kind::kError);
  EXPECT_EQ(error.op, "any");
  EXPECT_EQ(error.rank, -1);
  for (const char* bad : {"hang", "hang:allreduce", "stall:allreduce:1", "hang:broadcast:1", "hang:allreduce:0",
                          "hang:allreduce:x", "hang:allreduce:1@", "hang:allreduce:1@-1", "hang:allreduce:1:2"}) {
    const std::string what = error_of([&] { lt::cuda::parse_sim_comm_fault(bad); });
    EXPECT_EQ(what.rfind(std::string("LT_SIM_COMM_FAULT=") + bad + ": expected KIND:OP:N[@RANK]", 0), 0u) << what;
  }
}

// The second all-reduce hangs: the first completes; the call returns, and the rank finds the hang
// at its next wait, at the deadline, naming it. MPI is called for it all the same (its peers must
// not wait in it: device_comm_sim.cpp).
TEST(CudaSimCommFaults, HungCollectiveTimesOutNamingIt) {
  Rig rig(1, "hang:allreduce:2@1", 0.3);
  rig.comm->set_context("gradients of layer 1, step 1");
  rig.comm->allreduce_sum(rig.grads.data(), 64);
  rig.comm->synchronize();
  EXPECT_EQ(rig.host.calls, 1);
  rig.comm->set_context("gradients of layer 0, step 2");
  const auto t0 = Clock::now();
  rig.comm->allreduce_sum(rig.grads.data(), 16);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.3) << "the hung call waited";
  EXPECT_EQ(rig.host.calls, 2);
  bool comm_fault = false;
  const std::string what = error_of([&] { rig.comm->synchronize(); }, &comm_fault);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%s\n(after %.3f s)\n", what.c_str(), took);
  EXPECT_TRUE(comm_fault);
  EXPECT_EQ(what,
            "simulated NCCL allreduce (64 bytes, gradients of layer 0, step 2) did not complete within 0.3 s "
            "(--comm-timeout): a peer rank stopped or the network failed; the communicator was aborted");
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 3.0);
  // Aborted: no further use, and no MPI call.
  EXPECT_NE(error_of([&] { rig.comm->allgather(rig.weights.data(), 32); }).find("aborted"), std::string::npos);
  EXPECT_EQ(rig.host.calls, 2);
}

// The failing all-gather returns; the next wait reports its error at once.
TEST(CudaSimCommFaults, ErroringCollectiveFailsAtOnce) {
  Rig rig(0, "error:allgather:1", 60.0);
  rig.comm->allreduce_sum(rig.grads.data(), 8);
  rig.comm->set_context("bf16 weights after the update, step 1");
  const auto t0 = Clock::now();
  rig.comm->allgather(rig.weights.data(), 32);
  EXPECT_EQ(rig.host.calls, 2);
  bool comm_fault = false;
  const std::string what = error_of([&] { rig.comm->synchronize(); }, &comm_fault);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  EXPECT_TRUE(comm_fault);
  EXPECT_EQ(what,
            "simulated NCCL allgather (128 bytes, bf16 weights after the update, step 1) failed: simulated "
            "asynchronous error (LT_SIM_COMM_FAULT=error:allgather:1); the communicator was aborted");
}

// A fault for another rank, or for another kind of collective, changes nothing.
TEST(CudaSimCommFaults, OtherRanksAndCollectivesRunNormally) {
  for (const char* fault : {"hang:any:1@0", "error:reduce:1"}) {
    Rig rig(1, fault, 0.3);
    for (int i = 0; i < 3; ++i) {
      rig.comm->allreduce_sum(rig.grads.data(), 8);
      rig.comm->allgather(rig.weights.data(), 32);
      rig.comm->synchronize();
    }
    EXPECT_EQ(rig.host.calls, 6) << fault;
  }
}

}  // namespace
