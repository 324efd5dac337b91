// Waiting for device collectives by polling, up to a deadline (see comm_wait.h).
#include "llamatrain/comm_wait.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace lt {

WaitOutcome wait_with_deadline(const std::function<PollState(std::string* error)>& poll, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  constexpr std::chrono::microseconds kLongestPause{100};
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::chrono::microseconds pause{1};
  WaitOutcome out;
  for (;;) {
    out.state = poll(&out.error);
    if (out.state != PollState::kPending || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kLongestPause);
  }
  out.waited_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

size_t PendingCollectives::add(const std::string& op, size_t bytes) {
  pending_.push_back({op, context_, bytes});
  return pending_.size() - 1;
}

std::string PendingCollectives::describe(size_t i) const {
  const Record& r = pending_.at(i);
  return strcat(library_, " ", r.op, " (", r.bytes, " bytes", r.context.empty() ? "" : ", ", r.context, ")");
}

void PendingCollectives::wait_all(const CollectivePoller& p, double timeout_s) {
  // Collectives on one stream complete in issue order: the first one not done is the one waited on.
  size_t first = 0;
  const WaitOutcome w = wait_with_deadline(
      [&](std::string* error) {
        while (first < pending_.size() && p.done(first)) ++first;
        if (first == pending_.size()) return PollState::kDone;
        *error = p.async_error();
        return error->empty() ? PollState::kPending : PollState::kFailed;
      },
      timeout_s);
  if (w.state == PollState::kDone) {
    pending_.clear();
    return;
  }
  if (w.state == PollState::kFailed) fail(first, w.error, p);
  p.abort();
  throw CommFault(strcat(describe(first), " did not complete within ", timeout_s,
                         " s (--comm-timeout): a peer rank stopped or the network failed; the communicator was "
                         "aborted"));
}

void PendingCollectives::fail(size_t i, const std::string& error, const CollectivePoller& p) {
  p.abort();
  throw CommFault(strcat(describe(i), " failed: ", error, "; the communicator was aborted"));
}

}  // namespace lt
