// The device communicator on GPUs (see device_comm.h): NCCL, bootstrapped over the host (MPI)
// communicator. Compiled by nvcc only.
//
// NCCL is opened with dlopen when the first multi-rank device communicator is made, not linked:
// one-rank runs (a laptop, the GPU check) never need it, and a binary built here runs on a GPU
// machine whose NCCL lives elsewhere (e.g. in PyTorch's wheel). Tried in order: $LLAMATRAIN_NCCL
// (a path), the soname (LD_LIBRARY_PATH, the loader cache), the toolkit's library directory.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/device.h"
#include "backend/cuda/device_comm.h"
#include "backend/cuda/dynamic_library.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct NcclApi {
  decltype(&::ncclGetErrorString) ncclGetErrorString = nullptr;
  decltype(&::ncclGetVersion) ncclGetVersion = nullptr;
  decltype(&::ncclGetUniqueId) ncclGetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) ncclCommInitRank = nullptr;
  decltype(&::ncclCommDestroy) ncclCommDestroy = nullptr;
  decltype(&::ncclAllReduce) ncclAllReduce = nullptr;
  decltype(&::ncclReduce) ncclReduce = nullptr;
  decltype(&::ncclAllGather) ncclAllGather = nullptr;
  decltype(&::ncclGroupStart) ncclGroupStart = nullptr;
  decltype(&::ncclGroupEnd) ncclGroupEnd = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    std::string tried;
    void* lib = dynlib::open_first(nccl_library_candidates(), &tried);
    if (!lib)
      fail(strcat("--device cuda with more than one rank needs NCCL, which could not be loaded (set LLAMATRAIN_NCCL ",
                  "to the path of libnccl.so.2):", tried));
    NcclApi a;
    auto load = [&](auto& fn, const char* name) { dynlib::load_symbol(lib, fn, name, "NCCL"); };
    load(a.ncclGetErrorString, "ncclGetErrorString");
    load(a.ncclGetVersion, "ncclGetVersion");
    load(a.ncclGetUniqueId, "ncclGetUniqueId");
    load(a.ncclCommInitRank, "ncclCommInitRank");
    load(a.ncclCommDestroy, "ncclCommDestroy");
    load(a.ncclAllReduce, "ncclAllReduce");
    load(a.ncclReduce, "ncclReduce");
    load(a.ncclAllGather, "ncclAllGather");
    load(a.ncclGroupStart, "ncclGroupStart");
    load(a.ncclGroupEnd, "ncclGroupEnd");
    return a;
  }();
  return api;
}

bool nccl_ok(ncclResult_t r) { return r == ncclSuccess; }
const char* nccl_describe(ncclResult_t r) { return nccl().ncclGetErrorString(r); }
#define LT_NCCL_CHECK(call) LT_API_CHECK("NCCL", call, nccl_ok, nccl_describe)

class NcclComm final : public DeviceComm {
 public:
  NcclComm(Comm& host, cudaStream_t stream) : rank_(host.rank()), size_(host.size()), stream_(stream) {
    // Rank 0 makes the unique id; every rank must learn whether that worked before the broadcast,
    // or the others would wait in it forever.
    ncclUniqueId id{};
    agree(host, [&] {
      if (rank_ == 0) LT_NCCL_CHECK(nccl().ncclGetUniqueId(&id));
    });
    host.broadcast(&id, sizeof id, 0);
    agree(host, [&] { LT_NCCL_CHECK(nccl().ncclCommInitRank(&comm_, size_, id, rank_)); });
  }
  ~NcclComm() override {
    if (comm_) nccl().ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void allreduce_sum(float* buf, size_t count) override {
    LT_NCCL_CHECK(nccl().ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_, stream_));
  }
  void reduce_sum(float* buf, size_t count, int root) override {
    LT_NCCL_CHECK(nccl().ncclReduce(buf, buf, count, ncclFloat32, ncclSum, root, comm_, stream_));
  }
  void allgather(__nv_bfloat16* buf, size_t shard_count) override {
    LT_NCCL_CHECK(nccl().ncclAllGather(buf + size_t(rank_) * shard_count, buf, shard_count, ncclBfloat16, comm_,
                                       stream_));
  }
  void group_begin() override { LT_NCCL_CHECK(nccl().ncclGroupStart()); }
  void group_end() override { LT_NCCL_CHECK(nccl().ncclGroupEnd()); }

 private:
  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceComm> make_device_comm(Comm& host, cudaStream_t stream) {
  return std::make_unique<NcclComm>(host, stream);
}

LT_CUDA_NAMESPACE_END
