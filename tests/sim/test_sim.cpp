// Self-tests of the CUDA execution simulator (kernels/sim/cuda_sim.h): each kernel here would give
// a different answer if the simulator got the corresponding CUDA rule wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda_compat.cuh"

namespace {

// ---- barrier ordering ---------------------------------------------------------------------------
// Each round, thread t writes a round-dependent value and, after __syncthreads, reads the slot of
// thread t+1 (which runs later in the fiber order): without a working barrier it would read the
// previous round's value. A second barrier keeps the next round's write after every read.
constexpr int kBarrierRounds = 4;

__global__ void barrier_kernel(int* out /*(rounds, n)*/, int salt) {
  __shared__ int slot[1024];
  const int n = blockDim.x;
  const int t = threadIdx.x;
  for (int r = 0; r < kBarrierRounds; ++r) {
    slot[t] = salt + r * 1000 + t;
    __syncthreads();
    out[r * n + t] = slot[(t + 1) % n];
    __syncthreads();
  }
}

TEST(CudaSim, BarrierOrdering) {
  for (int n : {32, 96, 256}) {
    for (int salt : {7, 100000}) {
      std::vector<int> out(kBarrierRounds * n, -1);
      lt::launch_kernel(barrier_kernel, dim3(1), dim3(n), 0, nullptr, out.data(), salt);
      for (int r = 0; r < kBarrierRounds; ++r)
        for (int t = 0; t < n; ++t)
          ASSERT_EQ(out[r * n + t], salt + r * 1000 + (t + 1) % n) << "n=" << n << " round " << r << " t " << t;
    }
  }
}

// A thread that returns before a barrier the others reach is barrier divergence: undefined by the
// CUDA C++ Programming Guide (sm_70+ happens to count returned threads as arrived; older parts
// hang), so the strict simulator stops the kernel and names the barrier, in every thread order.
__global__ void early_exit_kernel(int* out, int n_active) {
  __shared__ int slot[1024];
  const int t = threadIdx.x;
  if (t >= n_active) return;
  slot[t] = t * 2;
  __syncthreads();
  out[t] = slot[n_active - 1 - t];
}

TEST(CudaSimDeathTest, ReturnBeforeABarrierIsDivergence) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  std::vector<int> out(64, -1);
  EXPECT_DEATH(lt::launch_kernel(early_exit_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 40),
               "barrier divergence: .*test_sim.cpp:[0-9]+");
  lt::launch_kernel(early_exit_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 64);  // all threads: fine
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], (63 - t) * 2);
}

// Lane 0 waits at the block barrier while lanes 1..31 wait for it in a shuffle: a hang on the
// device; the simulator must report it instead of spinning.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  }
}

TEST(CudaSimDeathTest, DivergentBarrierIsReported) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  std::vector<int> out(64, 0);
  EXPECT_DEATH(lt::launch_kernel(divergent_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.data()),
               "deadlock|barrier divergence");
}

// ---- shuffles -------------------------------------------------------------------------------------
// Every variant on an int and a float payload; the expected source lane of each variant is
// computed on the host from the rules of the CUDA Programming Guide.
enum ShuffleCase {
  kXor1, kXor2, kXor4, kXor8, kXor16,
  kDown1, kDown5, kDown16, kDown3Width8,
  kUp3, kUp2Width16,
  kIdx0, kIdxPlus3, kIdx5Width16,
  kXor4Width8, kXor8Width8, kXor16Width8,
  kNumShuffleCases
};

__device__ int lane_value(int tid) { return tid * 7 + 3; }

__global__ void shuffle_kernel(int* out_i /*(n, cases)*/, float* out_f /*(n, cases)*/) {
  const int tid = threadIdx.x;
  const int lane = tid % warpSize;
  const int vi = lane_value(tid);
  const float vf = 0.5f * static_cast<float>(vi);
  const unsigned full = 0xffffffffu;
  int* oi = out_i + tid * kNumShuffleCases;
  float* of = out_f + tid * kNumShuffleCases;
#define LT_CASE(c, call_i, call_f) \
  oi[c] = call_i;                  \
  of[c] = call_f
  LT_CASE(kXor1, __shfl_xor_sync(full, vi, 1), __shfl_xor_sync(full, vf, 1));
  LT_CASE(kXor2, __shfl_xor_sync(full, vi, 2), __shfl_xor_sync(full, vf, 2));
  LT_CASE(kXor4, __shfl_xor_sync(full, vi, 4), __shfl_xor_sync(full, vf, 4));
  LT_CASE(kXor8, __shfl_xor_sync(full, vi, 8), __shfl_xor_sync(full, vf, 8));
  LT_CASE(kXor16, __shfl_xor_sync(full, vi, 16), __shfl_xor_sync(full, vf, 16));
  LT_CASE(kDown1, __shfl_down_sync(full, vi, 1), __shfl_down_sync(full, vf, 1));
  LT_CASE(kDown5, __shfl_down_sync(full, vi, 5), __shfl_down_sync(full, vf, 5));
  LT_CASE(kDown16, __shfl_down_sync(full, vi, 16), __shfl_down_sync(full, vf, 16));
  LT_CASE(kDown3Width8, __shfl_down_sync(full, vi, 3, 8), __shfl_down_sync(full, vf, 3, 8));
  LT_CASE(kUp3, __shfl_up_sync(full, vi, 3), __shfl_up_sync(full, vf, 3));
  LT_CASE(kUp2Width16, __shfl_up_sync(full, vi, 2, 16), __shfl_up_sync(full, vf, 2, 16));
  LT_CASE(kIdx0, __shfl_sync(full, vi, 0), __shfl_sync(full, vf, 0));
  LT_CASE(kIdxPlus3, __shfl_sync(full, vi, (lane + 3) % 32), __shfl_sync(full, vf, (lane + 3) % 32));
  LT_CASE(kIdx5Width16, __shfl_sync(full, vi, 5, 16), __shfl_sync(full, vf, 5, 16));
  LT_CASE(kXor4Width8, __shfl_xor_sync(full, vi, 4, 8), __shfl_xor_sync(full, vf, 4, 8));
  LT_CASE(kXor8Width8, __shfl_xor_sync(full, vi, 8, 8), __shfl_xor_sync(full, vf, 8, 8));
  LT_CASE(kXor16Width8, __shfl_xor_sync(full, vi, 16, 8), __shfl_xor_sync(full, vf, 16, 8));
#undef LT_CASE
}

// The lane whose value `lane` receives in case c.
int expected_source_lane(int c, int lane) {
  auto down = [&](int d, int w) { return (lane % w) + d < w ? lane + d : lane; };
  auto up = [&](int d, int w) { return (lane % w) - d >= 0 ? lane - d : lane; };
  auto idx = [&](int s, int w) { return (lane / w) * w + s % w; };
  // xor may read an earlier segment but not a later one (it then gets its own value).
  auto xr = [&](int m, int w) { return ((lane ^ m) / w) > (lane / w) ? lane : (lane ^ m); };
  switch (c) {
    case kXor1: return lane ^ 1;
    case kXor2: return lane ^ 2;
    case kXor4: return lane ^ 4;
    case kXor8: return lane ^ 8;
    case kXor16: return lane ^ 16;
    case kDown1: return down(1, 32);
    case kDown5: return down(5, 32);
    case kDown16: return down(16, 32);
    case kDown3Width8: return down(3, 8);
    case kUp3: return up(3, 32);
    case kUp2Width16: return up(2, 16);
    case kIdx0: return 0;
    case kIdxPlus3: return (lane + 3) % 32;
    case kIdx5Width16: return idx(5, 16);
    case kXor4Width8: return xr(4, 8);
    case kXor8Width8: return xr(8, 8);
    case kXor16Width8: return xr(16, 8);
  }
  return -1;
}

TEST(CudaSim, ShufflesMatchThePermutations) {
  for (int n : {32, 64, 96}) {
    std::vector<int> out_i(n * kNumShuffleCases, -1);
    std::vector<float> out_f(n * kNumShuffleCases, -1.f);
    lt::launch_kernel(shuffle_kernel, dim3(1), dim3(n), 0, nullptr, out_i.data(), out_f.data());
    for (int tid = 0; tid < n; ++tid) {
      const int warp_base = tid / 32 * 32;
      for (int c = 0; c < kNumShuffleCases; ++c) {
        const int src = warp_base + expected_source_lane(c, tid % 32);
        ASSERT_EQ(out_i[tid * kNumShuffleCases + c], lane_value(src)) << "n=" << n << " tid " << tid << " case " << c;
        ASSERT_EQ(out_f[tid * kNumShuffleCases + c], 0.5f * lane_value(src)) << "n=" << n << " tid " << tid << " case " << c;
      }
    }
  }
}

// The butterfly reduction every kernel uses: all lanes end with the warp's sum; then a 2-D block
// (x 16, y 6: warps span rows) reduces through shared memory.
__global__ void reduce_kernel(int* warp_sums /*(n)*/, int* block_sum) {
  __shared__ int partial[32];
  const int tid = threadIdx.x + blockDim.x * threadIdx.y;
  const int n = blockDim.x * blockDim.y;
  int v = tid + 1;
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  warp_sums[tid] = v;
  if (tid % 32 == 0) partial[tid / 32] = v;
  __syncthreads();
  if (tid < 32) {
    int s = tid < n / 32 ? partial[tid] : 0;
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (tid == 0) *block_sum = s;
  }
}

TEST(CudaSim, ButterflyReductionAcrossWarps) {
  std::vector<int> warp_sums(96, 0);
  int block_sum = 0;
  lt::launch_kernel(reduce_kernel, dim3(1), dim3(16, 6), 0, nullptr, warp_sums.data(), &block_sum);
  for (int tid = 0; tid < 96; ++tid) {
    const int w = tid / 32;
    const int expect = (32 * w + 1 + 32 * w + 32) * 32 / 2;  // sum of w*32+1 .. w*32+32
    EXPECT_EQ(warp_sums[tid], expect) << "tid " << tid;
  }
  EXPECT_EQ(block_sum, 96 * 97 / 2);
}

// A shuffle whose mask names lanes that do not exist (last warp of a 40-thread block) is
// undefined on the device; the simulator refuses it.
__global__ void partial_warp_shuffle_kernel(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1); }

TEST(CudaSimDeathTest, ShuffleMaskNamingMissingLanesIsReported) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  std::vector<int> out(40, 0);
  EXPECT_DEATH(lt::launch_kernel(partial_warp_shuffle_kernel, dim3(1), dim3(40), 0, nullptr, out.data()),
               "does not exist");
}

// ---- atomics ----------------------------------------------------------------------------------------
__global__ void atomic_kernel(int* counter, float* fsum, int* seen /*(total)*/) {
  const int old = atomicAdd(counter, 1);
  seen[old] += 1;  // every old value must be returned exactly once
  atomicAdd(fsum, 0.5f);
  __syncthreads();
  atomicAdd(fsum, 0.25f);
}

TEST(CudaSim, AtomicsSumAndReturnDistinctOldValues) {
  const int blocks = 7, threads = 96, total = blocks * threads;
  int counter = 0;
  float fsum = 0.f;
  std::vector<int> seen(total, 0);
  lt::launch_kernel(atomic_kernel, dim3(blocks), dim3(threads), 0, nullptr, &counter, &fsum, seen.data());
  EXPECT_EQ(counter, total);
  EXPECT_EQ(fsum, 0.75f * total);  // exact: every partial sum is a multiple of 0.25 below 2^22
  for (int i = 0; i < total; ++i) ASSERT_EQ(seen[i], 1) << i;
}

// ---- shared memory per block ------------------------------------------------------------------------
// Each block fills its shared array with block-specific values and reads it back reversed after a
// barrier; a simulator that shared one array between concurrently running blocks, or that let a
// block see another's writes, would mix block ids.
__global__ void shared_per_block_kernel(int* out /*(blocks, n)*/) {
  __shared__ int s[256];
  const int n = blockDim.x;
  const int t = threadIdx.x;
  s[t] = static_cast<int>(blockIdx.x) * 1000 + t;
  __syncthreads();
  out[blockIdx.x * n + t] = s[n - 1 - t];
}

TEST(CudaSim, StaticSharedMemoryIsPerBlock) {
  const int blocks = 4, n = 64;
  std::vector<int> out(blocks * n, -1);
  lt::launch_kernel(shared_per_block_kernel, dim3(blocks), dim3(n), 0, nullptr, out.data());
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t) ASSERT_EQ(out[b * n + t], b * 1000 + (n - 1 - t)) << "block " << b << " t " << t;
}

__global__ void dynamic_smem_kernel(float* out /*(blocks, n)*/) {
  LT_DYNAMIC_SMEM(float, buf);
  const int n = blockDim.x;
  const int t = threadIdx.x;
  buf[t] = static_cast<float>(blockIdx.x) + 0.001f * t;
  __syncthreads();
  out[blockIdx.x * n + t] = buf[n - 1 - t];
}

TEST(CudaSim, DynamicSharedMemoryIsPerBlockAndAligned) {
  const int blocks = 3, n = 96;
  std::vector<float> out(blocks * n, -1.f);
  lt::launch_kernel(dynamic_smem_kernel, dim3(blocks), dim3(n), n * sizeof(float), nullptr, out.data());
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t)
      ASSERT_EQ(out[b * n + t], static_cast<float>(b) + 0.001f * (n - 1 - t)) << "block " << b << " t " << t;
}

// ---- indices ------------------------------------------------------------------------------------------
__global__ void index_kernel(int* hits /*(total)*/, int* dims /*(6)*/) {
  const int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
  const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
  const int block_linear = bx + gridDim.x * (by + gridDim.y * bz);
  const int thread_linear = tx + blockDim.x * (ty + blockDim.y * tz);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  hits[block_linear * threads + thread_linear] += 1 + 0 * tx;
  if (block_linear == 0 && thread_linear == 0) {
    dims[0] = gridDim.x, dims[1] = gridDim.y, dims[2] = gridDim.z;
    dims[3] = blockDim.x, dims[4] = blockDim.y, dims[5] = blockDim.z;
  }
}

TEST(CudaSim, MultiDimensionalGridVisitsEveryThreadOnce) {
  const dim3 grid(3, 4, 2), block(8, 4, 2);
  const int total = 3 * 4 * 2 * 8 * 4 * 2;
  std::vector<int> hits(total, 0), dims(6, 0);
  lt::launch_kernel(index_kernel, grid, block, 0, nullptr, hits.data(), dims.data());
  for (int i = 0; i < total; ++i) ASSERT_EQ(hits[i], 1) << i;
  EXPECT_EQ(dims, (std::vector<int>{3, 4, 2, 8, 4, 2}));
}

}  // namespace
