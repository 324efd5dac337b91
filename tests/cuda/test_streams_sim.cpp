// The CUDA backend's streams in the simulator (kernels/sim/stream_sim.h): a ZeRO training step,
// whose gradient buckets are reduced on a second stream while backward continues on the default
// one, gives the same bits in every stream order and when the collectives land late; without its
// stream waits (fault injection) some order gives other numbers; and a host copy of device memory
// that work on another stream still writes, or a collective in flight, is reported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_comm.h"
#include "llamatrain/config.h"
#include "llamatrain/model.h"
#include "llamatrain/zero.h"
#include "sim/stream_sim.h"

namespace {

// Rank 0 of a 2-rank world whose other rank holds the same values: sums double them (what rank 1
// would add), gathers leave the other shard as it was. The device collectives (device_comm_sim.cpp)
// call it in place of MPI, so a collective that runs before its input is written gives other numbers.
class MirrorComm final : public lt::Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "mirror"; }
  void allreduce_sum(void* buf, size_t count, lt::DType t) override { twice(buf, count, t); }
  void reduce_scatter_sum(void* buf, size_t shard_count, lt::DType t) override { twice(buf, shard_count, t); }
  void reduce_sum(void* buf, size_t count, lt::DType t, int root) override {
    if (root == 0) twice(buf, count, t);
  }
  void allgather(void*, size_t, lt::DType) override {}
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  // With late_polls > 0 the device collectives complete late: each lands (its sum is made) at the
  // late_polls-th call of done(), as a GPU's lands while the host goes on; until then its stream
  // holds what is queued after it.
  std::unique_ptr<lt::NonblockingCollectives> make_nonblocking() override;
  int late_polls = 0;

 private:
  static void twice(void* buf, size_t count, lt::DType t) {
    ASSERT_TRUE(t == lt::DType::kF32 || t == lt::DType::kF64);
    for (size_t i = 0; i < count; ++i) {
      if (t == lt::DType::kF32) static_cast<float*>(buf)[i] *= 2.f;
      else static_cast<double*>(buf)[i] *= 2.0;
    }
  }
};

class LateCollectives final : public lt::NonblockingCollectives {
 public:
  LateCollectives(lt::Comm& comm, int polls) : comm_(comm), polls_(polls) {}
  uint64_t start_allreduce_sum(void* buf, size_t count, lt::DType t) override {
    return open([=] { comm_.allreduce_sum(buf, count, t); });
  }
  uint64_t start_reduce_sum(void* buf, size_t count, lt::DType t, int root) override {
    return open([=] { comm_.reduce_sum(buf, count, t, root); });
  }
  uint64_t start_allgather(void* buf, size_t shard_count, lt::DType t) override {
    return open([=] { comm_.allgather(buf, shard_count, t); });
  }
  uint64_t start_allgather_v(void* buf, const std::vector<size_t>& counts, lt::DType t) override {
    return open([=] { comm_.allgather_v(buf, counts, t); });
  }
  bool done(uint64_t ticket) override {
    const auto it = open_.find(ticket);
    if (it == open_.end()) return true;
    if (--it->second.polls_left > 0) return false;
    it->second.land();
    open_.erase(it);
    ++landed;
    return true;
  }
  static inline int landed = 0;  // over the process, for the test's report

 private:
  struct Open {
    std::function<void()> land;
    int polls_left = 0;
  };
  uint64_t open(std::function<void()> land) {
    open_[next_] = {std::move(land), polls_};
    return next_++;
  }
  lt::Comm& comm_;
  int polls_;
  uint64_t next_ = 1;
  std::map<uint64_t, Open> open_;
};

std::unique_ptr<lt::NonblockingCollectives> MirrorComm::make_nonblocking() {
  if (late_polls == 0) return Comm::make_nonblocking();
  return std::make_unique<LateCollectives>(*this, late_polls);
}

// Random tokens, the loss on every token.
struct Tokens {
  std::vector<int32_t> inputs, targets;
  std::vector<uint8_t> mask;
  Tokens(int n, int V, uint32_t seed) : inputs(n), targets(n), mask(n, 1) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> tok(0, V - 1);
    for (int i = 0; i < n; ++i) inputs[i] = tok(rng), targets[i] = tok(rng);
  }
  lt::Batch batch(int B, int T) const {
    lt::Batch b;
    b.B = B;
    b.T = T;
    b.inputs = inputs.data();
    b.targets = targets.data();
    b.loss_mask = mask.data();
    return b;
  }
};

struct Outcome {
  std::vector<double> losses, norms;
  std::vector<float> params;  // fp32 master weights of rank 0's shard (the rest as loaded)
};

// Two ZeRO steps of two micro-batches each (the buckets of the second are reduced during its
// backward) in the given stream order, with or without the stream waits.
Outcome train(int stage, const std::string& order, bool skip_waits, int late_polls = 0) {
  lt::sim::set_stream_order(lt::sim::parse_schedule(order.c_str()));
  lt::sim::skip_stream_waits(skip_waits);
  const lt::Llama2Config cfg = lt::preset_config("tiny");
  lt::Llama2Model init(cfg);
  init.init_random(5);
  MirrorComm comm;
  comm.late_polls = late_polls;
  lt::ZeroOptimizer host(comm, init.layout(), stage, lt::AdamWConfig{});
  std::vector<float> params = init.params();
  params.resize(host.padded_size(), 0.f);
  lt::cuda::CudaModel dev(cfg);
  dev.set_collectives({lt::kDefaultCommTimeoutS, 0});  // a bucket per block, reduced as backward goes
  dev.init_optimizer(host, params.data());
  constexpr int B = 1, T = 16;
  Outcome out;
  for (int step = 1; step <= 2; ++step) {
    dev.clear_grads();
    double loss = 0;
    for (int mb = 0; mb < 2; ++mb) {
      const Tokens tokens(B * T, cfg.vocab_size, uint32_t(100 * step + mb));
      const lt::Batch batch = tokens.batch(B, T);
      loss += dev.forward(batch);
      if (mb == 0) dev.backward(batch, 1.f / (2 * B * T));
      else dev.backward_last(batch, 1.f / (2 * B * T));
    }
    out.losses.push_back(loss);
    out.norms.push_back(dev.reduce_and_clip_grads(1.0f));
    dev.optimizer_step(1e-2f, step);
  }
  dev.optimizer_state_to_host(host, params.data());
  out.params = params;
  lt::sim::skip_stream_waits(false);
  lt::sim::set_stream_order(lt::sim::parse_schedule(std::getenv("LT_SIM_STREAM_ORDER")));
  return out;
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

TEST(CudaSimStreams, ZeroStepsGiveTheSameBitsInEveryStreamOrder) {
  for (int stage : {1, 2}) {
    const Outcome ref = train(stage, "forward", false);
    for (const char* order : {"reverse", "random:3"}) {
      if (stage == 1 && order[1] == 'a') continue;  // time: one random order is enough for ZeRO 2
      const Outcome got = train(stage, order, false);
      std::printf("[ streams ] ZeRO %d, %s: losses %.9g %.9g, norms %.9g %.9g (forward: %.9g %.9g, %.9g %.9g)\n",
                  stage, order, got.losses[0], got.losses[1], got.norms[0], got.norms[1], ref.losses[0],
                  ref.losses[1], ref.norms[0], ref.norms[1]);
      EXPECT_EQ(got.losses, ref.losses) << "ZeRO " << stage << ", " << order;
      EXPECT_EQ(got.norms, ref.norms) << "ZeRO " << stage << ", " << order;
      EXPECT_EQ(differing(got.params, ref.params), 0u) << "ZeRO " << stage << ", " << order;
    }
  }
}

// The device collectives land some polls after they start (MirrorComm::late_polls), while the
// backward goes on: the same bits as when each lands at its start.
TEST(CudaSimStreams, ZeroStepsGiveTheSameBitsWhenCollectivesLandLate) {
  for (int stage : {1, 2}) {
    const Outcome ref = train(stage, "forward", false);
    for (const char* order : {"forward", "reverse"}) {
      const int before = LateCollectives::landed;
      const Outcome got = train(stage, order, false, 5);
      std::printf("[ streams ] ZeRO %d, %s, %d collectives landing at their 5th poll: norms %.9g %.9g (at start: "
                  "%.9g %.9g)\n",
                  stage, order, LateCollectives::landed - before, got.norms[0], got.norms[1], ref.norms[0],
                  ref.norms[1]);
      EXPECT_GT(LateCollectives::landed - before, 0);
      EXPECT_EQ(got.losses, ref.losses) << "ZeRO " << stage << ", " << order;
      EXPECT_EQ(got.norms, ref.norms) << "ZeRO " << stage << ", " << order;
      EXPECT_EQ(differing(got.params, ref.params), 0u) << "ZeRO " << stage << ", " << order;
    }
  }
}

// Fault injection: DeviceZero's stream_wait before each bucket's collective does nothing. Program
// order (forward) still runs the backward kernels before the collective, as the simulator did
// before it had streams; the reverse order runs the collective first, on gradients not yet written.
TEST(CudaSimStreams, AMissingStreamWaitChangesTheResult) {
  const Outcome ref = train(2, "forward", false);
  const Outcome hidden = train(2, "forward", true);
  const Outcome found = train(2, "reverse", true);
  const size_t n = differing(found.params, ref.params);
  std::printf("[ streams ] without the waits: forward norms %.9g %.9g, reverse %.9g %.9g (with: %.9g %.9g); "
              "%zu of %zu weights differ in reverse\n",
              hidden.norms[0], hidden.norms[1], found.norms[0], found.norms[1], ref.norms[0], ref.norms[1], n,
              ref.params.size());
  EXPECT_EQ(differing(hidden.params, ref.params), 0u);
  EXPECT_NE(found.norms[0], ref.norms[0]);
  EXPECT_GT(n, 0u);
}

TEST(CudaSimStreamsDeathTest, CopyToHostOfMemoryAnotherStreamWritesIsReported) {
  EXPECT_DEATH(
      {
        float* p = static_cast<float*>(lt::cuda::device_alloc(256 * sizeof(float)));
        cudaStream_t s = lt::cuda::stream_create();
        lt::sim::memset_async(p + 64, 0, 64 * sizeof(float), s);
        float host[128];
        lt::cuda::copy_to_host(host, p, sizeof host);
      },
      "the host reads 512 bytes at .* \\(copy_to_host\\) while 'memset', queued on stream [0-9]+ and not waited for, "
      "writes them");
}

// A device collective in flight (started, not landed: device_comm_sim.cpp) still writes its buffer:
// a host copy of it that its communicator did not wait for is reported.
TEST(CudaSimStreamsDeathTest, CopyToHostOfACollectiveInFlightIsReported) {
  EXPECT_DEATH(
      {
        MirrorComm comm;
        comm.late_polls = 1 << 30;
        float* p = static_cast<float*>(lt::cuda::device_alloc(256 * sizeof(float)));
        cudaStream_t s = lt::cuda::stream_create();
        auto device_comm = lt::cuda::make_device_comm(comm, s, 60.0);
        device_comm->allreduce_sum(p, 64);
        float host[128];
        lt::cuda::copy_to_host(host, p, sizeof host);
      },
      "the host reads 512 bytes at .* \\(copy_to_host\\) while 'allreduce', queued on stream [0-9]+ and not waited "
      "for, writes them");
}

TEST(CudaSimStreams, CopyToHostAfterTheDefaultStreamWaitedIsFine) {
  float* p = static_cast<float*>(lt::cuda::device_alloc(256 * sizeof(float)));
  cudaStream_t s = lt::cuda::stream_create();
  lt::cuda::device_memset(p, 0xff, 256 * sizeof(float));
  lt::cuda::stream_wait(s, nullptr);  // without it, an order could run the two memsets the other way round
  lt::sim::memset_async(p + 64, 0, 64 * sizeof(float), s);
  lt::cuda::stream_wait(nullptr, s);
  float host[256];
  lt::cuda::copy_to_host(host, p, sizeof host);
  EXPECT_EQ(host[64], 0.f);
  EXPECT_EQ(host[127], 0.f);
  EXPECT_TRUE(std::isnan(host[128])) << "the default stream's memset";
  EXPECT_TRUE(std::isnan(host[63]));
  lt::cuda::stream_destroy(s);
  lt::cuda::device_free(p);
}

// The host-wait rule (device.h): each of the runtime's five waiting calls runs the hook first (the
// hook's own waits do not run it again); the queuing calls do not.
TEST(CudaSimStreams, EveryHostWaitRunsTheSettleHookFirst) {
  int runs = 0;
  lt::cuda::set_host_wait_hook([&runs] {
    ++runs;
    lt::cuda::stream_synchronize(nullptr);  // a wait inside the hook: not run again
  });
  float* p = static_cast<float*>(lt::cuda::device_alloc(64 * sizeof(float)));
  float host[64] = {};
  cudaStream_t s = lt::cuda::stream_create();
  lt::cuda::DeviceEvent e = lt::cuda::event_create();
  lt::cuda::device_memset(p, 0, sizeof host);
  lt::cuda::event_record(e, nullptr);
  lt::cuda::stream_wait(s, nullptr);
  lt::cuda::copy_on_device(p + 32, p, 32 * sizeof(float), s);
  EXPECT_EQ(runs, 0) << "a call that only queues work ran the hook";
  lt::cuda::stream_synchronize(s);
  lt::cuda::event_synchronize(e);
  lt::cuda::device_synchronize();
  lt::cuda::copy_to_device(p, host, sizeof host);
  lt::cuda::copy_to_host(host, p, sizeof host);
  EXPECT_EQ(runs, 5);
  lt::cuda::set_host_wait_hook(nullptr);
  lt::cuda::stream_synchronize(s);
  EXPECT_EQ(runs, 5);
  lt::cuda::event_destroy(e);
  lt::cuda::stream_destroy(s);
  lt::cuda::device_free(p);
}

}  // namespace
