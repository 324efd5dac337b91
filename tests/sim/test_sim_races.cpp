// The simulator's race detector (kernels/sim/race_sim.h): each kind of hazard a GPU has, in a small
// kernel, must stop the kernel with a report naming the kernel, the memory, both threads and both
// source lines; the same kernels with the barrier, fence or atomic that makes them correct must run
// clean. These tests are only in the checked build (llamatrain_sim_tests), where the kernels are
// instrumented.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_compat.cuh"
#include "sim/race_sim.h"
#include "tensor_core.cuh"

namespace {

// ---- kernels with and without the synchronisation they need ---------------------------------------
__global__ void shared_neighbour_kernel(int* out, bool sync) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = t + 1;
  if (sync) __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

__global__ void shared_overwrite_kernel(int* out, bool sync) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = t;
  __syncthreads();
  const int neighbour = s[(t + 1) % blockDim.x];
  if (sync) __syncthreads();
  s[t] = 2 * neighbour;  // without the barrier: thread t-1 may not have read s[t] yet
  out[t] = neighbour;
}

__global__ void global_write_write_kernel(int* out, bool distinct) {
  out[distinct ? threadIdx.x : 0] = static_cast<int>(threadIdx.x);
}

__global__ void cross_block_kernel(int* out, bool distinct) {
  if (threadIdx.x == 0) out[distinct ? blockIdx.x : 0] = static_cast<int>(blockIdx.x);
}

__global__ void warp_neighbour_kernel(int* out, bool fence) {
  __shared__ int s[32];
  const int lane = threadIdx.x;
  s[lane] = 0;
  __syncthreads();
  s[lane] = lane * 3;
  if (fence) __syncwarp();
  out[lane] = s[lane ^ 1];
}

// A shuffle exchanges registers; it is no memory fence for shared memory (only __syncwarp is).
__global__ void shuffle_is_no_fence_kernel(int* out) {
  __shared__ int s[32];
  const int lane = threadIdx.x;
  s[lane] = lane;
  const int partner = __shfl_xor_sync(0xffffffffu, lane, 1);
  out[lane] = s[partner];
}

__global__ void uninitialised_shared_kernel(int* out, bool init) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  if (init || t % 2 == 0) s[t] = t;
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = s[t];
}

__global__ void uninitialised_dynamic_kernel(float* out, bool init) {
  LT_DYNAMIC_SMEM(float, s);
  const int t = threadIdx.x;
  if (init || t != 7) s[t] = 1.0f;
  __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

__global__ void atomic_counter_kernel(int* counter, int* out, bool plain_read) {
  atomicAdd(counter, 1);
  if (plain_read) out[threadIdx.x] = *counter;  // reads what other threads update atomically
}

// bf16 neighbours share a 4-byte word; writing one is not a race with writing the other.
__global__ void bf16_halves_kernel(__nv_bfloat16* out) {
  __shared__ __nv_bfloat16 s[64];
  const int t = threadIdx.x;
  s[t] = __float2bfloat16(static_cast<float>(t));
  __syncthreads();
  out[t] = s[63 - t];
}

// A buffer refilled by cp.async while other threads may still read it (the double-buffering
// hazard): the copy can land at any time after its issue, so the issue races with those reads.
__global__ void cp_async_refill_kernel(int* out, const int* src, bool sync) {
  __shared__ __align__(16) int buf[4];
  const int t = threadIdx.x;
  if (t < 4) buf[t] = -1;
  __syncthreads();
  out[t] = buf[t % 4];
  if (sync) __syncthreads();
  if (t == 0) lt::tc::cp_async_16(buf, src);
  lt::tc::cp_async_commit();
  __syncthreads();  // the wait comes an interval later: only the issue meets the reads
  lt::tc::cp_async_wait<0>();
  __syncthreads();
  out[64 + t] = buf[t % 4];
}

// ---- helpers ------------------------------------------------------------------------------------------
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, size_t smem, Args... args) {
  lt::launch_kernel(kernel, grid, block, smem, nullptr, args...);
}

class CudaSimRaceDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(lt::sim::race_detection_available()) << "this test binary must be the checked (instrumented) build";
  }
  std::vector<int> out = std::vector<int>(128, 0);
};

TEST_F(CudaSimRaceDeathTest, ReadAfterWriteInOneIntervalOnSharedMemory) {
  launch(shared_neighbour_kernel, dim3(1), dim3(64), 0, out.data(), true);
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(out[63], 1);
  EXPECT_DEATH(launch(shared_neighbour_kernel, dim3(1), dim3(64), 0, out.data(), false),
               "data race in kernel .*shared_neighbour_kernel.*: (read|write) of 4 bytes at 0x[0-9a-f]+ \\(a static "
               "__shared__ array\\) by thread [0-9]+,0,0 at test_sim_races.cpp:[0-9]+.*earlier (write|read) by thread "
               "[0-9]+,0,0 at test_sim_races.cpp:[0-9]+.*same barrier interval");
}

TEST_F(CudaSimRaceDeathTest, WriteAfterReadInOneIntervalOnSharedMemory) {
  launch(shared_overwrite_kernel, dim3(1), dim3(64), 0, out.data(), true);
  EXPECT_EQ(out[5], 6);
  EXPECT_DEATH(launch(shared_overwrite_kernel, dim3(1), dim3(64), 0, out.data(), false),
               "data race in kernel .*shared_overwrite_kernel.*: (write|read) of 4 bytes .*earlier (read|write) by thread");
}

TEST_F(CudaSimRaceDeathTest, CpAsyncIntoABufferStillBeingReadIsARace) {
  alignas(16) static const int src[4] = {10, 11, 12, 13};
  launch(cp_async_refill_kernel, dim3(1), dim3(64), 0, out.data(), src, true);
  EXPECT_EQ(out[1], -1);
  EXPECT_EQ(out[64 + 1], 11);
  EXPECT_DEATH(launch(cp_async_refill_kernel, dim3(1), dim3(64), 0, out.data(), src, false),
               "data race in kernel .*cp_async_refill_kernel.*: (read|write) of .*earlier (write|read).* by thread");
}

TEST_F(CudaSimRaceDeathTest, WriteWriteOnGlobalMemory) {
  launch(global_write_write_kernel, dim3(1), dim3(64), 0, out.data(), true);
  EXPECT_DEATH(launch(global_write_write_kernel, dim3(1), dim3(64), 0, out.data(), false),
               "data race in kernel .*global_write_write_kernel.*: write of 4 bytes .*\\(global memory\\).*earlier "
               "write by thread [0-9]+,0,0");
}

TEST_F(CudaSimRaceDeathTest, TwoBlocksOfOneLaunchOnTheSameGlobalWord) {
  launch(cross_block_kernel, dim3(4), dim3(32), 0, out.data(), true);
  EXPECT_EQ(out[3], 3);
  EXPECT_DEATH(launch(cross_block_kernel, dim3(4), dim3(32), 0, out.data(), false),
               "data race in kernel .*cross_block_kernel.*earlier write by thread 0,0,0 of block 0 .*blocks are not "
               "ordered");
}

TEST_F(CudaSimRaceDeathTest, LanesOfAWarpNeedSyncwarp) {
  launch(warp_neighbour_kernel, dim3(1), dim3(32), 0, out.data(), true);
  EXPECT_EQ(out[0], 3);
  EXPECT_DEATH(launch(warp_neighbour_kernel, dim3(1), dim3(32), 0, out.data(), false),
               "data race in kernel .*warp_neighbour_kernel.*no __syncthreads\\(\\) or __syncwarp\\(\\) between");
  EXPECT_DEATH(launch(shuffle_is_no_fence_kernel, dim3(1), dim3(32), 0, out.data()),
               "data race in kernel .*shuffle_is_no_fence_kernel");
}

TEST_F(CudaSimRaceDeathTest, ReadOfSharedMemoryTheBlockNeverWrote) {
  launch(uninitialised_shared_kernel, dim3(2), dim3(64), 0, out.data(), true);
  EXPECT_EQ(out[64 + 9], 9);
  EXPECT_DEATH(launch(uninitialised_shared_kernel, dim3(2), dim3(64), 0, out.data(), false),
               "read of uninitialised shared memory in kernel .*uninitialised_shared_kernel.*static __shared__ array\\) "
               "by thread [0-9]*[13579],0,0");
  std::vector<float> f(64);
  launch(uninitialised_dynamic_kernel, dim3(1), dim3(64), 64 * sizeof(float), f.data(), true);
  EXPECT_EQ(f[6], 1.0f);
  EXPECT_DEATH(launch(uninitialised_dynamic_kernel, dim3(1), dim3(64), 64 * sizeof(float), f.data(), false),
               "read of uninitialised shared memory .*dynamic shared memory, byte 28 of 256\\) by thread 6,0,0");
}

TEST_F(CudaSimRaceDeathTest, AtomicsDoNotRaceWithAtomicsButWithPlainAccesses) {
  int counter = 0;
  launch(atomic_counter_kernel, dim3(2), dim3(64), 0, &counter, out.data(), false);
  EXPECT_EQ(counter, 128);
  EXPECT_DEATH(launch(atomic_counter_kernel, dim3(1), dim3(64), 0, &counter, out.data(), true),
               "data race in kernel .*atomic_counter_kernel.*: (read|write) of 4 bytes");
}

TEST_F(CudaSimRaceDeathTest, NeighbouringBf16ElementsAreSeparate) {
  std::vector<__nv_bfloat16> b(64);
  launch(bf16_halves_kernel, dim3(1), dim3(64), 0, b.data());
  EXPECT_EQ(__bfloat162float(b[0]), 63.0f);
}

TEST_F(CudaSimRaceDeathTest, CanBeTurnedOffForATestThatRacesOnPurpose) {
  lt::sim::set_race_detection(false);
  launch(shared_neighbour_kernel, dim3(1), dim3(64), 0, out.data(), false);  // would stop the kernel
  lt::sim::set_race_detection(true);
  SUCCEED();
}

}  // namespace
