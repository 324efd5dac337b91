// The device communicator of --device cuda-sim (see device_comm.h): the simulator's device memory
// is host memory, so the host communicator's nonblocking collectives (MPI's, on a communicator of
// their own: comm.h) reduce and gather it directly. Compiled only for the simulator build.
//
// A collective is an operation on its stream (kernels/sim/stream_sim.h, start_in_order) that
// starts at its point of issue: the stream is run up to it (so the work it waits for runs first,
// and work it does not wait for may still be queued: a missing wait changes the sums), then MPI's
// collective is started. Every rank starts them in program order, which is the same on every rank.
// It completes as a GPU's does, while the host goes on: what is queued after it on its stream runs
// once MPI reports it done, and the host finds it complete, or hung, or failed, when it next waits
// for it, in synchronize() (the optimizer's settle, device.h's host-wait rule), through the same
// wait as NCCL's (llamatrain/comm_wait.h).
//
// The faults LT_SIM_COMM_FAULT injects (device_comm_sim.h) change only what the host is told: a
// hung collective is never reported done, and a failed one reports an asynchronous error, so the
// rank finds its fault when it next waits for it, as a GPU rank would. MPI's collective still runs,
// and so does every later one: the peers must not be left waiting in a collective the faulty rank
// never starts, since the simulator starts a collective when its stream gets to it, and a peer
// whose stream waits there would issue no more and never reach the host collective the faulty
// rank waits in before its own next wait. The peers then wait in what comes next, until the faulty
// rank ends the job.
#include "backend/cuda/device_comm_sim.h"

#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "backend/cuda/device.h"
#include "llamatrain/comm_wait.h"
#include "sim/stream_sim.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

sim::Access reads_writes(const void* p, size_t bytes) {
  sim::Access a;
  a.reads = a.writes = {sim::Range{p, bytes}};
  return a;
}

// A decimal count >= lo (at most 9 digits), or false.
bool parse_count(const std::string& s, int64_t lo, int64_t* out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoll(s);
  return *out >= lo;
}

class HostDeviceComm final : public DeviceComm {
 public:
  HostDeviceComm(Comm& host, cudaStream_t stream, double timeout_s, SimCommFault fault)
      : host_(host), mpi_(host.make_nonblocking()), stream_(stream), timeout_s_(timeout_s),
        fault_(std::move(fault)), pending_("simulated NCCL") {
    if (fault_.rank >= 0 && fault_.rank != host_.rank()) fault_.kind = SimCommFault::Kind::kNone;
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name(); }
  void allreduce_sum(float* buf, size_t count) override { allreduce(buf, count, DType::kF32); }
  void reduce_sum(float* buf, size_t count, int root) override { reduce(buf, count, DType::kF32, root); }
  void allreduce_sum(__nv_bfloat16* buf, size_t count) override { allreduce(buf, count, DType::kBF16); }
  void reduce_sum(__nv_bfloat16* buf, size_t count, int root) override { reduce(buf, count, DType::kBF16, root); }
  void allgather(__nv_bfloat16* buf, size_t shard_count) override {
    collective("allgather", buf, size_t(size()) * shard_count * sizeof(*buf),
               [=] { return mpi_->start_allgather(buf, shard_count, DType::kBF16); });
  }
  void allgather_v(__nv_bfloat16* buf, const std::vector<size_t>& counts) override {
    size_t n = 0;
    for (size_t c : counts) n += c;
    collective("allgather", buf, n * sizeof(*buf), [=] { return mpi_->start_allgather_v(buf, counts, DType::kBF16); });
  }
  void group_begin() override {}
  void group_end() override {}
  void set_context(std::string context) override { pending_.set_context(std::move(context)); }
  void synchronize() override {
    count_stream_sync();
    pending_.wait_all(poller(), timeout_s_);
    tickets_.clear();
    sim::stream_synchronize(stream_);  // anything queued on the stream after the collectives
  }

 private:
  static constexpr size_t kNoFault = std::numeric_limits<size_t>::max();

  void allreduce(void* buf, size_t count, DType t) {
    collective("allreduce", buf, count * dtype_size(t), [=] { return mpi_->start_allreduce_sum(buf, count, t); });
  }
  void reduce(void* buf, size_t count, DType t, int root) {
    collective("reduce", buf, count * dtype_size(t), [=] { return mpi_->start_reduce_sum(buf, count, t, root); });
  }
  // Starts MPI's collective at its point of issue on the stream (see the top of this file).
  void collective(const char* op, const void* buf, size_t bytes, std::function<uint64_t()> start) {
    LT_CHECK(!aborted_, "simulated NCCL ", op, ": the device communicator was aborted");
    const size_t i = pending_.add(op, bytes);
    if (faulty_ == kNoFault && strikes(op)) {
      faulty_ = i;
      if (fault_.kind == SimCommFault::Kind::kError)
        async_error_ = strcat("simulated asynchronous error (LT_SIM_COMM_FAULT=", fault_.spec, ")");
    }
    auto ticket = std::make_shared<uint64_t>(0);
    std::shared_ptr<NonblockingCollectives> mpi = mpi_;  // the stream may outlive this communicator
    sim::start_in_order(
        stream_, op, reads_writes(buf, bytes), [=] { *ticket = start(); }, [=] { return mpi->done(*ticket); });
    tickets_.push_back(*ticket);
  }
  // Counts op against the fault's; true at its N-th.
  bool strikes(const char* op) {
    if (fault_.kind == SimCommFault::Kind::kNone || (fault_.op != "any" && fault_.op != op)) return false;
    return ++seen_ == fault_.n;
  }
  CollectivePoller poller() {
    CollectivePoller p;
    p.done = [this](size_t i) { return i < faulty_ && mpi_->done(tickets_[i]); };  // never, from the fault on
    p.async_error = [this] { return async_error_; };
    p.abort = [this] { aborted_ = true; };
    return p;
  }

  Comm& host_;
  std::shared_ptr<NonblockingCollectives> mpi_;
  cudaStream_t stream_;
  double timeout_s_;
  SimCommFault fault_;
  PendingCollectives pending_;
  std::vector<uint64_t> tickets_;  // of the pending collectives
  int64_t seen_ = 0;          // collectives of the fault's kind so far
  size_t faulty_ = kNoFault;  // index among the pending of the collective the fault struck
  std::string async_error_;
  bool aborted_ = false;
};

}  // namespace

SimCommFault parse_sim_comm_fault(const std::string& spec) {
  SimCommFault f;
  f.spec = spec;
  if (spec.empty()) return f;
  const auto bad = [&] {
    fail(strcat("LT_SIM_COMM_FAULT=", spec, ": expected KIND:OP:N[@RANK] with KIND hang or error, OP allreduce, ",
                "reduce, allgather or any, N >= 1 and RANK >= 0 (e.g. hang:allreduce:1@1)"));
  };
  std::string rest = spec;
  if (const size_t at = rest.find('@'); at != std::string::npos) {
    int64_t rank = 0;
    if (!parse_count(rest.substr(at + 1), 0, &rank)) bad();
    f.rank = int(rank);
    rest.resize(at);
  }
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t e = rest.find(':', b);
    parts.push_back(rest.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (parts.size() != 3) bad();
  if (parts[0] == "hang") f.kind = SimCommFault::Kind::kHang;
  else if (parts[0] == "error") f.kind = SimCommFault::Kind::kError;
  else bad();
  f.op = parts[1];
  if (f.op != "allreduce" && f.op != "reduce" && f.op != "allgather" && f.op != "any") bad();
  if (!parse_count(parts[2], 1, &f.n)) bad();
  return f;
}

std::unique_ptr<DeviceComm> make_sim_device_comm(Comm& host, cudaStream_t stream, double timeout_s,
                                                 const SimCommFault& fault) {
  return std::make_unique<HostDeviceComm>(host, stream, timeout_s, fault);
}

std::unique_ptr<DeviceComm> make_device_comm(Comm& host, cudaStream_t stream, double timeout_s) {
  const char* spec = std::getenv("LT_SIM_COMM_FAULT");
  return make_sim_device_comm(host, stream, timeout_s, parse_sim_comm_fault(spec ? spec : ""));
}

LT_CUDA_NAMESPACE_END
