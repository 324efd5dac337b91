// Waiting for device collectives by polling up to a deadline (llamatrain/comm_wait.h): what both
// device communicators (NCCL, cuda-sim's) rely on to end a job instead of hanging it.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "llamatrain/comm_wait.h"
#include "test_util.h"

namespace lt {
namespace {

using testing::error_of;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(CommWait, ReturnsAsSoonAsThePollSaysDone) {
  int calls = 0;
  const WaitOutcome w = wait_with_deadline([&](std::string*) { return ++calls == 5 ? PollState::kDone : PollState::kPending; },
                                           10.0);
  EXPECT_EQ(w.state, PollState::kDone);
  EXPECT_EQ(calls, 5);
  // Pauses of 1, 2, 4 and 8 us between the calls.
  EXPECT_LT(w.waited_s, 0.5);
}

TEST(CommWait, ReportsAFailureWithItsError) {
  const WaitOutcome w = wait_with_deadline(
      [](std::string* error) {
        *error = "unhandled system error";
        return PollState::kFailed;
      },
      10.0);
  EXPECT_EQ(w.state, PollState::kFailed);
  EXPECT_EQ(w.error, "unhandled system error");
}

TEST(CommWait, GivesUpAtTheDeadline) {
  int calls = 0;
  const auto t0 = Clock::now();
  const WaitOutcome w = wait_with_deadline([&](std::string*) { return ++calls, PollState::kPending; }, 0.2);
  const double took = seconds_since(t0);
  std::printf("gave up after %.3f s and %d polls\n", took, calls);
  EXPECT_EQ(w.state, PollState::kPending);
  EXPECT_GE(w.waited_s, 0.2);
  EXPECT_GE(took, 0.2);
  EXPECT_LT(took, 2.0);
  // Backing off to 100 us (and the timer slack): at most about 2000 polls in 0.2 s, not a busy
  // loop of millions.
  EXPECT_GT(calls, 10);
  EXPECT_LT(calls, 4000);
}

// Three collectives of which the first two complete: the third is named, the communicator aborted.
struct FakeCollectives {
  PendingCollectives pending{"NCCL"};
  size_t complete = 0;  // collectives done so far
  std::string error;    // the communicator's asynchronous error
  int aborts = 0;
  CollectivePoller poller() {
    CollectivePoller p;
    p.done = [this](size_t i) { return i < complete; };
    p.async_error = [this] { return error; };
    p.abort = [this] { ++aborts; };
    return p;
  }
  FakeCollectives() {
    pending.set_context("gradients of layer 1, step 3");
    pending.add("allreduce", 4096);
    pending.set_context("gradients of layer 0, step 3");
    pending.add("allreduce", 2048);
    pending.set_context("bf16 weights after the update, step 3");
    pending.add("allgather", 1024);
  }
};

TEST(CommWait, AllCompleteForgetsThem) {
  FakeCollectives f;
  f.complete = 3;
  f.pending.wait_all(f.poller(), 1.0);
  EXPECT_EQ(f.pending.size(), 0u);
  EXPECT_EQ(f.aborts, 0);
}

TEST(CommWait, TimeoutNamesTheFirstCollectiveNotCompleteAndAborts) {
  FakeCollectives f;
  f.complete = 2;
  const std::string what = error_of([&] { f.pending.wait_all(f.poller(), 0.1); });
  EXPECT_EQ(what,
            "NCCL allgather (1024 bytes, bf16 weights after the update, step 3) did not complete within 0.1 s "
            "(--comm-timeout): a peer rank stopped or the network failed; the communicator was aborted");
  EXPECT_EQ(f.aborts, 1);
  bool comm_fault = false;
  try {
    f.pending.wait_all(f.poller(), 0.01);
  } catch (const CommFault&) {
    comm_fault = true;
  }
  EXPECT_TRUE(comm_fault) << "not an lt::CommFault";
}

TEST(CommWait, AsyncErrorFailsAtOnceNamingTheCollectiveInFlight) {
  FakeCollectives f;
  f.complete = 1;
  f.error = "remote process exited or there was a network error";
  const auto t0 = Clock::now();
  const std::string what = error_of([&] { f.pending.wait_all(f.poller(), 60.0); });
  EXPECT_LT(seconds_since(t0), 1.0) << "waited for the deadline despite the error";
  EXPECT_EQ(what,
            "NCCL allreduce (2048 bytes, gradients of layer 0, step 3) failed: remote process exited or there was "
            "a network error; the communicator was aborted");
  EXPECT_EQ(f.aborts, 1);
}

// An error reported once everything completed does not fail a wait that has nothing left.
TEST(CommWait, AsyncErrorAfterCompletionIsNotThisWaitsFailure) {
  FakeCollectives f;
  f.complete = 3;
  f.error = "late";
  f.pending.wait_all(f.poller(), 1.0);
  EXPECT_EQ(f.aborts, 0);
}

}  // namespace
}  // namespace lt
