// Streams and events of the CUDA execution simulator (kernels/sim/stream_sim.h): queued work runs
// only at synchronisation points, each stream in issue order, across streams in the order the
// seed picks, never before an event it waits for; a missing wait changes the result in some order
// and a host read of memory that queued work writes is reported.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "cuda_compat.cuh"
#include "sim/stream_sim.h"

namespace {

using Log = std::vector<std::string>;

// Queued streams in the given order for the life of the object; immediate mode and the
// environment's order afterwards.
class QueuedStreams {
 public:
  explicit QueuedStreams(const std::string& order) {
    lt::sim::set_stream_order(lt::sim::parse_schedule(order.c_str()));
    lt::sim::set_queued_streams(true);
  }
  ~QueuedStreams() {
    lt::sim::set_queued_streams(false);
    lt::sim::skip_stream_waits(false);
    lt::sim::set_stream_order(lt::sim::parse_schedule(std::getenv("LT_SIM_STREAM_ORDER")));
  }
};

std::vector<std::string> every_order() {
  std::vector<std::string> orders = {"forward", "reverse"};
  for (int seed = 1; seed <= 16; ++seed) orders.push_back("random:" + std::to_string(seed));
  return orders;
}

void log_op(cudaStream_t s, Log* log, const std::string& name) {
  lt::sim::enqueue(s, name, lt::sim::Access{}, [log, name] { log->push_back(name); });
}

size_t position(const Log& log, const std::string& name) {
  return size_t(std::find(log.begin(), log.end(), name) - log.begin());
}

std::string joined(const Log& log) {
  std::string s;
  for (const auto& x : log) s += (s.empty() ? "" : " ") + x;
  return s;
}

// Five operations on each of the default stream (d) and two streams (a, b), issued round-robin.
Log run_three_streams(const std::string& order) {
  QueuedStreams queued(order);
  cudaStream_t a = lt::sim::stream_create(), b = lt::sim::stream_create();
  Log log;
  for (int i = 0; i < 5; ++i) {
    log_op(nullptr, &log, "d" + std::to_string(i));
    log_op(a, &log, "a" + std::to_string(i));
    log_op(b, &log, "b" + std::to_string(i));
  }
  EXPECT_TRUE(log.empty()) << order << ": queued work ran before a synchronisation point";
  lt::sim::device_synchronize();
  lt::sim::stream_destroy(a);
  lt::sim::stream_destroy(b);
  return log;
}

TEST(SimStreams, EachStreamRunsInIssueOrderAtSynchronisation) {
  for (const std::string& order : every_order()) {
    const Log log = run_three_streams(order);
    ASSERT_EQ(log.size(), 15u) << order;
    for (const char* stream : {"d", "a", "b"})
      for (int i = 1; i < 5; ++i)
        EXPECT_LT(position(log, stream + std::to_string(i - 1)), position(log, stream + std::to_string(i)))
            << order << ": " << joined(log);
  }
}

TEST(SimStreams, OrderAcrossStreamsFollowsTheSeed) {
  EXPECT_EQ(joined(run_three_streams("forward")), "d0 a0 b0 d1 a1 b1 d2 a2 b2 d3 a3 b3 d4 a4 b4");
  EXPECT_EQ(joined(run_three_streams("reverse")), "b0 b1 b2 b3 b4 a0 a1 a2 a3 a4 d0 d1 d2 d3 d4");
  std::set<std::string> seen;
  for (int seed = 1; seed <= 16; ++seed) {
    const std::string order = "random:" + std::to_string(seed);
    const std::string log = joined(run_three_streams(order));
    EXPECT_EQ(joined(run_three_streams(order)), log) << "the same seed must replay the same order";
    seen.insert(log);
  }
  std::printf("[ streams ] 16 seeds gave %zu different interleavings\n", seen.size());
  EXPECT_GE(seen.size(), 12u);
}

// a: a0 a1 [record e] a2;  b: b0 [wait e] b1 b2. b1 after a1 in every order, b0 free to run first.
TEST(SimStreams, EventWaitIsHonouredInEveryOrder) {
  bool b0_first = false, b1_before_a2 = false;
  for (const std::string& order : every_order()) {
    QueuedStreams queued(order);
    cudaStream_t a = lt::sim::stream_create(), b = lt::sim::stream_create();
    lt::sim::Event* e = lt::sim::event_create();
    Log log;
    log_op(a, &log, "a0");
    log_op(a, &log, "a1");
    lt::sim::event_record(e, a);
    log_op(a, &log, "a2");
    log_op(b, &log, "b0");
    lt::sim::stream_wait_event(b, e);
    lt::sim::event_destroy(e);  // the queued wait keeps what it needs
    log_op(b, &log, "b1");
    log_op(b, &log, "b2");
    lt::sim::stream_synchronize(b);
    EXPECT_LT(position(log, "a1"), position(log, "b1")) << order << ": " << joined(log);
    b0_first |= position(log, "b0") < position(log, "a0");
    b1_before_a2 |= position(log, "b1") < position(log, "a2");
    lt::sim::device_synchronize();
    EXPECT_EQ(log.size(), 6u);
    lt::sim::stream_destroy(a);
    lt::sim::stream_destroy(b);
  }
  EXPECT_TRUE(b0_first) << "work before the wait was held back in every order";
  EXPECT_TRUE(b1_before_a2) << "the wait held b for work recorded after the event";
}

// ---- a missing wait between a copy stream and a compute stream ----------------------------------
__global__ void __launch_bounds__(128) twice_kernel(float* y, const float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.f * x[i];
}

// The copy stream uploads x, the compute stream doubles it into y after waiting for the copy
// (unless waits are skipped). Returns whether y is right.
bool upload_then_compute(const std::string& order, bool skip_waits) {
  QueuedStreams queued(order);
  lt::sim::skip_stream_waits(skip_waits);
  constexpr int n = 300;
  std::vector<float> host(n), x(n, 0.f), y(n, -1.f);
  for (int i = 0; i < n; ++i) host[i] = float(i + 1);
  cudaStream_t copy = lt::sim::stream_create(), compute = lt::sim::stream_create();
  lt::sim::Event* uploaded = lt::sim::event_create();
  lt::sim::memcpy_async(x.data(), host.data(), n * sizeof(float), copy);
  lt::sim::event_record(uploaded, copy);
  lt::sim::stream_wait_event(compute, uploaded);
  lt::launch_kernel(twice_kernel, dim3((n + 127) / 128), dim3(128), 0, compute, y.data(), x.data(), n);
  lt::sim::device_synchronize();
  lt::sim::event_destroy(uploaded);
  lt::sim::stream_destroy(copy);
  lt::sim::stream_destroy(compute);
  for (int i = 0; i < n; ++i)
    if (y[i] != 2.f * host[i]) return false;
  return true;
}

TEST(SimStreams, AMissingWaitIsFoundByFaultInjection) {
  std::vector<std::string> wrong;
  for (const std::string& order : every_order()) {
    EXPECT_TRUE(upload_then_compute(order, false)) << order << ": wrong result with the wait in place";
    if (!upload_then_compute(order, true)) wrong.push_back(order);
  }
  std::printf("[ streams ] without the wait, %zu of %zu orders give a wrong result:", wrong.size(),
              every_order().size());
  for (const auto& o : wrong) std::printf(" %s", o.c_str());
  std::printf("\n");
  EXPECT_TRUE(upload_then_compute("forward", true)) << "program order hides the missing wait, as before streams";
  EXPECT_FALSE(upload_then_compute("reverse", true)) << "the compute stream ran ahead of the copy";
  EXPECT_GE(wrong.size(), 4u);
}

// ---- host access to memory that queued work still touches ---------------------------------------
TEST(SimStreamsDeathTest, HostReadOfPendingWorkIsReported) {
  std::vector<float> host(64, 1.f), dev(64, 0.f);
  EXPECT_DEATH(
      {
        QueuedStreams queued("forward");
        cudaStream_t copy = lt::sim::stream_create();
        lt::sim::memcpy_async(dev.data(), host.data(), 64 * sizeof(float), copy);
        lt::sim::host_read(dev.data() + 8, 4, "the test's read");
      },
      "the host reads 4 bytes at .* \\(the test's read\\) while 'memcpy', queued on stream [0-9]+ and not waited "
      "for, writes them");
  EXPECT_DEATH(
      {
        QueuedStreams queued("forward");
        cudaStream_t other = lt::sim::stream_create();
        lt::launch_kernel(twice_kernel, dim3(1), dim3(128), 0, other, dev.data(), host.data(), 64);
        lt::sim::host_read(dev.data(), 4, "the test's read");
      },
      "'kernel launch \\(grid 1,1,1 block 128,1,1\\)', queued on stream [0-9]+ and not waited for, may access");
  EXPECT_DEATH(
      {
        QueuedStreams queued("forward");
        cudaStream_t copy = lt::sim::stream_create();
        lt::sim::memcpy_async(host.data(), dev.data(), 64 * sizeof(float), copy);
        lt::sim::host_write(dev.data(), 4, "the test's write");
      },
      "the host writes 4 bytes .* while 'memcpy', queued on stream [0-9]+ and not waited for, accesses them");
}

TEST(SimStreams, HostReadAfterTheDefaultStreamWaitedIsFine) {
  QueuedStreams queued("forward");  // leaves the memset queued when the read comes
  std::vector<float> host(64, 3.f), dev(64, 0.f);
  cudaStream_t copy = lt::sim::stream_create();
  lt::sim::Event* e = lt::sim::event_create();
  lt::sim::memcpy_async(dev.data(), host.data(), 64 * sizeof(float), copy);
  lt::sim::event_record(e, copy);
  lt::sim::stream_wait_event(nullptr, e);
  lt::sim::memset_async(host.data(), 0, 4, copy);  // other bytes: not a conflict
  lt::sim::host_read(dev.data(), 64 * sizeof(float), "the test's read");
  EXPECT_EQ(dev[63], 3.f);
  lt::sim::event_destroy(e);
  lt::sim::stream_destroy(copy);
}

TEST(SimStreams, ImmediateModeRunsEachOperationWhenIssued) {
  lt::sim::set_queued_streams(false);
  cudaStream_t s = lt::sim::stream_create();
  Log log;
  log_op(s, &log, "x");
  EXPECT_EQ(joined(log), "x");
  std::vector<float> x(8, 1.f), y(8, 0.f);
  lt::launch_kernel(twice_kernel, dim3(1), dim3(128), 0, s, y.data(), x.data(), 8);
  EXPECT_EQ(y[7], 2.f);
  lt::sim::stream_destroy(s);
}

}  // namespace
