// Waiting for device collectives without hanging (issue 15, item 8). NCCL collectives run
// asynchronously on a stream; a blocking cudaStreamSynchronize on one whose peer is gone, or whose
// network failed, never returns, and every rank of the job then waits forever. So the device
// communicators (src/backend/cuda/device_comm*.{cu,cpp}, both builds) wait by polling, up to a
// deadline (train --comm-timeout): each collective's completion (an event recorded after it) and
// the communicator's asynchronous error (ncclCommGetAsyncError). A failure or the deadline aborts
// the communicator (ncclCommAbort: its kernels stop, so freeing memory afterwards cannot block) and
// throws CommFault naming the collective, which src/cli/main.cpp turns into
// "[rank r/N host] ..." and MPI_Abort with status kExitCommFault, so the other ranks end too.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "llamatrain/error.h"

namespace lt {

// A collective on device buffers failed or did not complete within --comm-timeout on this rank.
// Its peers may be waiting in it, so the job is taken down (MPI_Abort) with the rank and the
// collective named, and exit status kExitCommFault.
class CommFault : public Error {
 public:
  using Error::Error;
};
// The exit status of a job ended by a CommFault (docs/usage.md, "Exit status"): the checkpoints
// written before it are intact, so a job script may resume it (on other nodes).
constexpr int kExitCommFault = 5;

// train --comm-timeout's default, in seconds: far longer than any healthy collective waits (the
// first one also connects NCCL's peers), short enough that a lost job is noticed.
constexpr double kDefaultCommTimeoutS = 300;
// The default size of ZeRO's gradient buckets (train --bucket-mb; zero_plan.h), as PyTorch DDP's
// 25 MB.
constexpr size_t kDefaultBucketMiB = 25;

enum class PollState { kPending, kDone, kFailed };

struct WaitOutcome {
  PollState state = PollState::kPending;  // kPending: the deadline passed first
  std::string error;                      // kFailed: what poll reported
  double waited_s = 0;
};

// Calls poll(&error) until it returns kDone or kFailed, or timeout_s seconds have passed (it is
// called at least once, and once more at the deadline). Between calls it sleeps 1 us at first,
// doubling up to 100 us (plus the kernel's timer slack, about 50 us): a collective is seen complete
// at most about 0.15 ms late, which a step of milliseconds or more does not notice, and a long wait
// costs a few thousand cheap wake-ups a second instead of a busy core.
WaitOutcome wait_with_deadline(const std::function<PollState(std::string* error)>& poll, double timeout_s);

// What a device communicator needs from its build to wait for its collectives.
struct CollectivePoller {
  std::function<bool(size_t i)> done;        // has pending collective i (in issue order) completed?
  std::function<std::string()> async_error;  // the communicator's asynchronous error; "" when none
  std::function<void()> abort;               // abort the communicator (never destroy it)
};

// The collectives a device communicator has issued and not yet seen complete, and what names each
// in a fault report: "NCCL allreduce (12800 bytes, gradients of layer 3, step 12)".
class PendingCollectives {
 public:
  // library: "NCCL", or "simulated NCCL" on cuda-sim.
  explicit PendingCollectives(std::string library) : library_(std::move(library)) {}
  // What the collectives issued from now on are for, e.g. "gradients of layer 3, step 12".
  void set_context(std::string context) { context_ = std::move(context); }
  // Records a collective just issued; returns its index among the pending ones.
  size_t add(const std::string& op, size_t bytes);
  size_t size() const { return pending_.size(); }
  // "<library> <op> (<bytes> bytes, <context>)".
  std::string describe(size_t i) const;
  // Waits for every pending collective for at most timeout_s seconds, then forgets them. On an
  // asynchronous error or at the deadline: p.abort(), then CommFault "<describe(first not
  // complete)> failed: <error>" or "... did not complete within <timeout_s> s".
  void wait_all(const CollectivePoller& p, double timeout_s);
  // Pending collective i failed when issued: p.abort(), then CommFault "<describe(i)> failed: <error>".
  [[noreturn]] void fail(size_t i, const std::string& error, const CollectivePoller& p);

 private:
  struct Record {
    std::string op, context;
    size_t bytes = 0;
  };
  std::string library_, context_;
  std::vector<Record> pending_;
};

}  // namespace lt
