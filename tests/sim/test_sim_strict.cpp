// The simulator as a strict judge (kernels/sim/cuda_sim.h): thread orders, barrier divergence,
// launch limits, and proof that a missing barrier in the real kernels is found: every
// __syncthreads() of rmsnorm.cu, attention.cu and attention_tc.cu is removed in turn (fault injection); in the checked
// build the race detector must report it (kernels/sim/race_sim.h), elsewhere (the ASan build) some
// order must change the result, while with all barriers in place every order gives the same bits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "rmsnorm.cuh"
#include "sim/race_sim.h"

namespace {

using lt::sim::Order;
using lt::sim::Schedule;

// Restores the schedule and the injected fault at the end of a test.
struct ScheduleGuard {
  Schedule saved = lt::sim::current_schedule();
  ~ScheduleGuard() {
    lt::sim::set_schedule(saved);
    lt::sim::skip_barrier("", 0);
  }
};

const Schedule kSchedules[] = {{Order::kForward, 0}, {Order::kReverse, 0}, {Order::kRandom, 1},
                               {Order::kRandom, 2},  {Order::kRandom, 3}};

std::string describe(const Schedule& s) {
  return s.order == Order::kForward ? "forward" : s.order == Order::kReverse ? "reverse" : "random:" + std::to_string(s.seed);
}

// ---- orders -------------------------------------------------------------------------------------------
// Thread t reads its neighbour's slot without a barrier in between: a race, whose outcome is the order.
__global__ void racy_kernel(int* out) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = t + 1;
  out[t] = s[(t + 1) % blockDim.x];  // missing __syncthreads() above
}
__global__ void race_free_kernel(int* out) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = t + 1;
  __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

std::vector<int> run_neighbour(void (*kernel)(int*)) {
  std::vector<int> out(64, 0);
  lt::launch_kernel(kernel, dim3(1), dim3(64), 0, nullptr, out.data());
  return out;
}

TEST(CudaSimStrict, OrdersExposeARaceAndAgreeOnARaceFreeKernel) {
  ScheduleGuard guard;
  lt::sim::set_race_detection(false);  // the race is the point here; the detector would stop it
  struct On {
    ~On() { lt::sim::set_race_detection(true); }
  } on;
  std::vector<std::vector<int>> racy, clean;
  for (const Schedule& s : kSchedules) {
    lt::sim::set_schedule(s);
    racy.push_back(run_neighbour(racy_kernel));
    clean.push_back(run_neighbour(race_free_kernel));
  }
  int racy_differs = 0;
  for (size_t i = 1; i < racy.size(); ++i) {
    racy_differs += racy[i] != racy[0];
    EXPECT_EQ(clean[i], clean[0]) << describe(kSchedules[i]);
  }
  EXPECT_GT(racy_differs, 0) << "no order exposed the missing barrier";
}

TEST(CudaSimStrict, ScheduleParsesAndRejects) {
  EXPECT_EQ(lt::sim::parse_schedule("reverse").order, Order::kReverse);
  const Schedule r = lt::sim::parse_schedule("random:42");
  EXPECT_EQ(r.order, Order::kRandom);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_THROW(lt::sim::parse_schedule("random:4x"), std::invalid_argument);
  EXPECT_THROW(lt::sim::parse_schedule("backwards"), std::invalid_argument);
}

// ---- barrier divergence and launch limits --------------------------------------------------------------
__global__ void return_before_barrier_kernel(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void two_barriers_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void empty_kernel(int*) {}

TEST(CudaSimStrictDeathTest, BarrierDivergenceIsReported) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  std::vector<int> out(64, 0);
  for (const Schedule& s : {Schedule{Order::kForward, 0}, Schedule{Order::kReverse, 0}}) {
    ScheduleGuard guard;
    lt::sim::set_schedule(s);
    EXPECT_DEATH(lt::launch_kernel(return_before_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.data()),
                 "barrier divergence: .*(returned|reached after thread 5,0,0 returned)")
        << describe(s);
    EXPECT_DEATH(lt::launch_kernel(two_barriers_kernel, dim3(1), dim3(64), 0, nullptr, out.data()),
                 "barrier divergence: this thread waits at __syncthreads\\(\\) at .*test_sim_strict.cpp:[0-9]+, thread")
        << describe(s);
  }
}

TEST(CudaSimStrictDeathTest, LaunchLimitsOfTheDevice) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  int x = 0;
  EXPECT_DEATH(lt::launch_kernel(empty_kernel, dim3(1, 65536), dim3(32), 0, nullptr, &x), "grid 1,65536,1 exceeds");
  EXPECT_DEATH(lt::launch_kernel(empty_kernel, dim3(1), dim3(1, 1, 65), 0, nullptr, &x), "block 1,1,65 exceeds");
  EXPECT_DEATH(lt::launch_kernel(empty_kernel, dim3(1), dim3(64, 32), 0, nullptr, &x), "at most 1024 threads");
  EXPECT_DEATH(lt::launch_kernel(empty_kernel, dim3(1), dim3(32), 48 * 1024 + 16, nullptr, &x),
               "49168 bytes of dynamic shared memory, above the 49152");
  EXPECT_DEATH(lt::set_max_dynamic_smem(empty_kernel, 200 * 1024), "above the opt-in maximum");
}

TEST(CudaSimStrict, DynamicSharedMemoryOptIn) {
  int x = 0;
  lt::set_max_dynamic_smem(empty_kernel, 100 * 1024);
  lt::launch_kernel(empty_kernel, dim3(1), dim3(32), 100 * 1024, nullptr, &x);  // allowed after the opt-in
  SUCCEED();
}

// ---- every barrier of the real kernels is needed, and missing one is found ----------------------------------
std::vector<__nv_bfloat16> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(d(rng));
  return v;
}
template <class T>
void append_bits(std::vector<uint32_t>& out, const std::vector<T>& v) {
  const size_t words = (v.size() * sizeof(T) + 3) / 4;
  const size_t at = out.size();
  out.resize(at + words, 0);
  std::memcpy(out.data() + at, v.data(), v.size() * sizeof(T));
}

// RMSNorm forward and backward on one input; every output's bits.
std::vector<uint32_t> run_rmsnorm() {
  const int N = 6, C = 300;  // C not a multiple of the block: partial warps and tails
  std::mt19937 rng(11);
  const auto x = random_bf16(size_t(N) * C, rng, 1.5f), w = random_bf16(C, rng, 1.f), g = random_bf16(size_t(N) * C, rng, 1.f);
  std::vector<__nv_bfloat16> out(size_t(N) * C), dx(size_t(N) * C);
  std::vector<float> rstd(N), dw(C, 0.f), scratch(lt::cuda::rmsnorm_backward_scratch_floats(N, C));
  lt::cuda::RmsnormForwardParams f;
  f.out = out.data(), f.rstd = rstd.data(), f.x = x.data(), f.weight = w.data();
  f.N = N, f.C = C, f.x_row_stride = C, f.out_row_stride = C;
  lt::cuda::rmsnorm_forward_cuda(f, nullptr);
  lt::cuda::RmsnormBackwardParams b;
  b.dx = dx.data(), b.dweight = dw.data(), b.scratch = scratch.data(), b.dout = g.data(), b.x = x.data();
  b.weight = w.data(), b.rstd = rstd.data(), b.N = N, b.C = C;
  b.dx_row_stride = C, b.dout_row_stride = C, b.x_row_stride = C;
  lt::cuda::rmsnorm_backward_cuda(b, nullptr);
  std::vector<uint32_t> all;
  append_bits(all, out), append_bits(all, rstd), append_bits(all, dx), append_bits(all, dw);
  return all;
}

// Attention forward and backward with `kernel` on B 1, T rows, 4 heads on 2 KV heads, head_dim hd,
// two packed examples (a boundary at row 40), inputs drawn from seed; the bits of every output.
std::vector<uint32_t> run_attention_case(int T, int hd, unsigned seed, lt::cuda::AttentionKernel kernel) {
  const int B = 1, H = 4, KVH = 2;
  std::mt19937 rng(seed);
  const auto q = random_bf16(size_t(T) * H * hd, rng, 1.f), k = random_bf16(size_t(T) * KVH * hd, rng, 1.f);
  const auto v = random_bf16(size_t(T) * KVH * hd, rng, 1.f), dout = random_bf16(size_t(T) * H * hd, rng, 1.f);
  std::vector<int32_t> seg(T);
  for (int t = 0; t < T; ++t) seg[t] = t < 40 ? 0 : 40;
  std::vector<__nv_bfloat16> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(size_t(B) * H * T), dsum(lse.size());
  lt::cuda::AttentionParams p;
  p.out = {out.data(), H * hd, hd};
  p.lse = lse.data();
  p.q = {q.data(), H * hd, hd};
  p.k = {k.data(), KVH * hd, hd};
  p.v = {v.data(), KVH * hd, hd};
  p.seg_start = seg.data();
  p.dout = {dout.data(), H * hd, hd};
  p.dq = {dq.data(), H * hd, hd};
  p.dk = {dk.data(), KVH * hd, hd};
  p.dv = {dv.data(), KVH * hd, hd};
  p.dsum = dsum.data();
  p.B = B, p.T = T, p.H = H, p.KVH = KVH, p.hd = hd;
  p.kernel = kernel;
  lt::cuda::attention_forward_cuda(p, nullptr);
  lt::cuda::attention_backward_cuda(p, nullptr);
  std::vector<uint32_t> all;
  append_bits(all, out), append_bits(all, lse), append_bits(all, dq), append_bits(all, dk), append_bits(all, dv);
  return all;
}

// The CUDA-core kernels (attention.cu): T 70 (several query and key tiles, a partial one), head_dim
// 16. The query tile at 64 sees no key of the first key tile (its rows start at 40), so the
// backward's skip path runs too.
std::vector<uint32_t> run_attention() { return run_attention_case(70, 16, 12, lt::cuda::AttentionKernel::kAuto); }

// The tensor-core kernels (attention_tc.cu): T 200 (four query tiles; the last sees keys 40..199,
// three key tiles, so a cp.async buffer is refilled after it was read; the dK/dV pass steps through
// up to 2 heads x 3 query tiles), head_dim 64.
std::vector<uint32_t> run_attention_tc() {
  return run_attention_case(200, 64, 13, lt::cuda::AttentionKernel::kTensorCores);
}

// Runs `run` in a child process under schedule s with the barrier at file:line removed. Returns
// how the result compared with `reference`: "same", "different", or the simulator's own report when
// it stopped the kernel (barrier divergence, a deadlock).
std::string mutated_run(std::vector<uint32_t> (*run)(), const std::vector<uint32_t>& reference, const char* file,
                        int line, const Schedule& s) {
  int err[2];
  if (pipe(err) != 0) return "pipe failed";
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err[1], 2);
    close(err[0]);
    lt::sim::skip_barrier(file, line);
    lt::sim::set_schedule(s);
    _exit(run() == reference ? 0 : 1);
  }
  close(err[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(err[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) <= 1) return WEXITSTATUS(status) == 0 ? "same" : "different";
  const size_t at = text.find("cuda_sim: ");
  return at == std::string::npos ? "crashed: " + text : text.substr(at, text.find('\n', at) - at);
}

// Same bits under every order; then each barrier of `file` removed in turn must, under some order,
// change the bits or stop the kernel with the simulator's report.
void every_barrier_is_needed(const char* file, std::vector<uint32_t> (*run)()) {
  ScheduleGuard guard;
  lt::sim::set_schedule(kSchedules[0]);
  const auto reference = run();
  for (const Schedule& s : kSchedules) {
    lt::sim::set_schedule(s);
    EXPECT_EQ(run(), reference) << file << ": the result depends on the thread order " << describe(s);
  }
  std::vector<int> lines;
  for (const auto& [f, line] : lt::sim::barrier_sites())
    if (f.size() >= std::strlen(file) && f.compare(f.size() - std::strlen(file), std::string::npos, file) == 0)
      lines.push_back(line);
  ASSERT_FALSE(lines.empty()) << "no __syncthreads() of " << file << " ran";
  for (const int line : lines) {
    if (lt::sim::race_detection_available()) {
      // The race detector names the hazard directly, in the plain forward order.
      const std::string report = mutated_run(run, reference, file, line, kSchedules[0]);
      std::printf("%s:%d removed -> %s\n", file, line, report.c_str());
      EXPECT_TRUE(report.find("data race") != std::string::npos ||
                  report.find("uninitialised shared memory") != std::string::npos)
          << file << ":" << line << ": the race detector did not report the missing barrier: " << report;
      continue;
    }
    std::string outcome = "same";
    for (const Schedule& s : kSchedules) {
      outcome = mutated_run(run, reference, file, line, s);
      if (outcome != "same") {
        outcome = describe(s) + ": " + outcome;
        break;
      }
    }
    std::printf("%s:%d removed -> %s\n", file, line, outcome.c_str());
    EXPECT_NE(outcome, "same") << file << ":" << line << ": no order shows the missing barrier";
  }
}

TEST(CudaSimStrict, EveryRmsnormBarrierIsNeededAndItsRemovalIsFound) {
  every_barrier_is_needed("/rmsnorm.cu", run_rmsnorm);
}

TEST(CudaSimStrict, EveryAttentionBarrierIsNeededAndItsRemovalIsFound) {
  every_barrier_is_needed("/attention.cu", run_attention);
}

TEST(CudaSimStrict, EveryTensorCoreAttentionBarrierIsNeededAndItsRemovalIsFound) {
  // The barrier after a tile's last read protects the refill of its cp.async buffer. The simulator
  // lands a copy at its wait, always after the next barrier, so no thread order can show the hazard:
  // only the race detector (which counts the destination as written at the issue) sees it.
  if (!lt::sim::race_detection_available()) GTEST_SKIP() << "needs the race detector (the checked build)";
  every_barrier_is_needed("/attention_tc.cu", run_attention_tc);
}

}  // namespace
