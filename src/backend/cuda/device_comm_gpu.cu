// The device communicator on GPUs (see device_comm.h): NCCL, bootstrapped over the host (MPI)
// communicator. Compiled by nvcc only.
//
// NCCL is opened with dlopen when the first multi-rank device communicator is made, not linked:
// one-rank runs (a laptop, the GPU check) never need it, and a binary built here runs on a GPU
// machine whose NCCL lives elsewhere (e.g. in PyTorch's wheel). Tried in order: $LLAMATRAIN_NCCL
// (a path), the soname (LD_LIBRARY_PATH, the loader cache), the toolkit's library directory.
//
// Faults end the job, never hang it (llamatrain/comm_wait.h): an event is recorded after each
// collective, and synchronize() polls those events and ncclCommGetAsyncError up to the timeout;
// a failure or the deadline calls ncclCommAbort (which stops NCCL's kernels) and throws
// lt::CommFault. ncclCommDestroy waits for the collectives in flight, so it is never called while
// an exception unwinds or with collectives not waited for: the communicator is aborted instead.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_comm.h"
#include "runtime/dynamic_library.h"
#include "llamatrain/comm_wait.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct NcclApi {
  decltype(&::ncclGetErrorString) ncclGetErrorString = nullptr;
  decltype(&::ncclGetVersion) ncclGetVersion = nullptr;
  decltype(&::ncclGetUniqueId) ncclGetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) ncclCommInitRank = nullptr;
  decltype(&::ncclCommDestroy) ncclCommDestroy = nullptr;
  decltype(&::ncclCommAbort) ncclCommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) ncclCommGetAsyncError = nullptr;
  decltype(&::ncclAllReduce) ncclAllReduce = nullptr;
  decltype(&::ncclReduce) ncclReduce = nullptr;
  decltype(&::ncclAllGather) ncclAllGather = nullptr;
  decltype(&::ncclBroadcast) ncclBroadcast = nullptr;
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
    load(a.ncclCommAbort, "ncclCommAbort");
    load(a.ncclCommGetAsyncError, "ncclCommGetAsyncError");
    load(a.ncclAllReduce, "ncclAllReduce");
    load(a.ncclReduce, "ncclReduce");
    load(a.ncclAllGather, "ncclAllGather");
    load(a.ncclBroadcast, "ncclBroadcast");
    load(a.ncclGroupStart, "ncclGroupStart");
    load(a.ncclGroupEnd, "ncclGroupEnd");
    return a;
  }();
  return api;
}

bool nccl_ok(ncclResult_t r) { return r == ncclSuccess; }
const char* nccl_describe(ncclResult_t r) { return nccl().ncclGetErrorString(r); }
#define LT_NCCL_CHECK(call) LT_API_CHECK("NCCL", call, nccl_ok, nccl_describe)
bool cuda_ok(cudaError_t e) { return e == cudaSuccess; }
const char* cuda_describe(cudaError_t e) { return cudaGetErrorString(e); }
#define LT_CUDA_CHECK(call) LT_API_CHECK("CUDA", call, cuda_ok, cuda_describe)

class NcclComm final : public DeviceComm {
 public:
  NcclComm(Comm& host, cudaStream_t stream, double timeout_s)
      : rank_(host.rank()), size_(host.size()), stream_(stream), timeout_s_(timeout_s), pending_("NCCL") {
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
    if (comm_) {
      // Destroying waits for the collectives in flight: abort while an exception unwinds (this rank
      // failed and the job is being taken down) or when some were never waited for.
      if (std::uncaught_exceptions() > uncaught_at_start_ || pending_.size() > 0) nccl().ncclCommAbort(comm_);
      else nccl().ncclCommDestroy(comm_);
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void allreduce_sum(float* buf, size_t count) override {
    issue("allreduce", count * sizeof(float),
          [&] { return nccl().ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_, stream_); });
  }
  void reduce_sum(float* buf, size_t count, int root) override {
    issue("reduce", count * sizeof(float),
          [&] { return nccl().ncclReduce(buf, buf, count, ncclFloat32, ncclSum, root, comm_, stream_); });
  }
  void allreduce_sum(__nv_bfloat16* buf, size_t count) override {
    issue("allreduce", count * sizeof(*buf),
          [&] { return nccl().ncclAllReduce(buf, buf, count, ncclBfloat16, ncclSum, comm_, stream_); });
  }
  void reduce_sum(__nv_bfloat16* buf, size_t count, int root) override {
    issue("reduce", count * sizeof(*buf),
          [&] { return nccl().ncclReduce(buf, buf, count, ncclBfloat16, ncclSum, root, comm_, stream_); });
  }
  void allgather(__nv_bfloat16* buf, size_t shard_count) override {
    issue("allgather", size_t(size_) * shard_count * sizeof(*buf), [&] {
      return nccl().ncclAllGather(buf + size_t(rank_) * shard_count, buf, shard_count, ncclBfloat16, comm_, stream_);
    });
  }
  // Uneven pieces: each owner broadcasts its piece, all in one group (NCCL's all-gather needs
  // equal counts).
  void allgather_v(__nv_bfloat16* buf, const std::vector<size_t>& counts) override {
    group_begin();
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      const size_t n = counts[size_t(r)];
      if (n > 0)
        issue("allgather", n * sizeof(*buf),
              [&] { return nccl().ncclBroadcast(buf + at, buf + at, n, ncclBfloat16, r, comm_, stream_); });
      at += n;
    }
    group_end();
  }
  void group_begin() override {
    LT_NCCL_CHECK(nccl().ncclGroupStart());
    ++group_depth_;
  }
  void group_end() override {
    --group_depth_;
    check(nccl().ncclGroupEnd(), pending_.size() - 1, "ncclGroupEnd");
    if (group_depth_ == 0) record_events();
  }
  void set_context(std::string context) override { pending_.set_context(std::move(context)); }
  void synchronize() override {
    count_stream_sync();
    pending_.wait_all(poller(), timeout_s_);
    recorded_ = 0;
  }

 private:
  template <class Call>
  void issue(const char* op, size_t bytes, Call&& call) {
    LT_CHECK(comm_, "NCCL ", op, ": the communicator was aborted");
    const size_t i = pending_.add(op, bytes);
    check(call(), i, op);
    if (group_depth_ == 0) record_events();  // a group's collectives are enqueued at ncclGroupEnd
  }
  // On failure the communicator is aborted and pending collective i named (what, when there is none).
  void check(ncclResult_t r, size_t i, const char* what) {
    if (r == ncclSuccess) return;
    if (i < pending_.size()) pending_.fail(i, nccl_describe(r), poller());
    abort_comm();
    throw CommFault(strcat("NCCL ", what, " failed: ", nccl_describe(r), "; the communicator was aborted"));
  }
  // An event after each collective enqueued since the last call, for synchronize() to poll.
  void record_events() {
    for (; recorded_ < pending_.size(); ++recorded_) {
      if (recorded_ == events_.size()) {
        cudaEvent_t e = nullptr;
        LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events_.push_back(e);
      }
      LT_CUDA_CHECK(cudaEventRecord(events_[recorded_], stream_));
    }
  }
  bool event_done(size_t i) const {
    if (i >= recorded_) return false;
    const cudaError_t r = cudaEventQuery(events_[i]);
    if (r == cudaErrorNotReady) return false;
    if (r != cudaSuccess) fail(strcat("CUDA cudaEventQuery after NCCL collective ", i, ": ", cudaGetErrorString(r)));
    return true;
  }
  std::string async_error() const {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = nccl().ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return strcat("ncclCommGetAsyncError: ", nccl_describe(r));
    return state == ncclSuccess || state == ncclInProgress ? std::string() : std::string(nccl_describe(state));
  }
  void abort_comm() {
    if (comm_) nccl().ncclCommAbort(std::exchange(comm_, nullptr));
  }
  CollectivePoller poller() {
    CollectivePoller p;
    p.done = [this](size_t i) { return event_done(i); };
    p.async_error = [this] { return async_error(); };
    p.abort = [this] { abort_comm(); };
    return p;
  }

  int rank_, size_;
  cudaStream_t stream_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  PendingCollectives pending_;
  std::vector<cudaEvent_t> events_;  // events_[i] recorded after pending collective i
  size_t recorded_ = 0;              // pending collectives with their event recorded
  int group_depth_ = 0;
  const int uncaught_at_start_ = std::uncaught_exceptions();  // > at destruction: unwinding
};

}  // namespace

std::unique_ptr<DeviceComm> make_device_comm(Comm& host, cudaStream_t stream, double timeout_s) {
  return std::make_unique<NcclComm>(host, stream, timeout_s);
}

LT_CUDA_NAMESPACE_END
