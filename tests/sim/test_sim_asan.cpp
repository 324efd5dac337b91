// Only in the AddressSanitizer build of the simulator tests (llamatrain_sim_tests_asan): shows
// that the configuration catches a kernel's out-of-bounds access, with the kernel's source line,
// in global memory and in dynamic shared memory, and a misaligned vector access (UBSan's alignment
// check) with its address. Without these, the ASan build could silently
// stop checking anything (a lost flag, a fiber stack ASan cannot see) and every test would pass.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_compat.cuh"

// detect_leaks=0: LeakSanitizer stops under ptrace-restricted sandboxes, and leaks are not what
// this build is for.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

namespace {

// Thread t writes out[t]; launched with one thread more than the buffer holds.
__global__ void write_past_end_kernel(float* out) { out[threadIdx.x] = 1.0f; }

// Each thread fills its slot of the dynamic shared memory; the launch passes one float too few.
__global__ void smem_past_end_kernel(float* out) {
  LT_DYNAMIC_SMEM(float, slots);
  slots[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = slots[blockDim.x - 1 - threadIdx.x];
}

TEST(SimAsan, InBoundsLaunchesAreClean) {
  std::vector<float> out(64, 0.f);
  lt::launch_kernel(write_past_end_kernel, dim3(1), dim3(64), 0, nullptr, out.data());
  for (float v : out) ASSERT_EQ(v, 1.0f);
  lt::launch_kernel(smem_past_end_kernel, dim3(1), dim3(64), 64 * sizeof(float), nullptr, out.data());
  for (int t = 0; t < 64; ++t) ASSERT_EQ(out[t], static_cast<float>(63 - t));
}

TEST(SimAsanDeathTest, GlobalOverflowInKernelIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::vector<float> out(63, 0.f);
        lt::launch_kernel(write_past_end_kernel, dim3(1), dim3(64), 0, nullptr, out.data());
      },
      "heap-buffer-overflow(.|\n)*write_past_end_kernel");
}

TEST(SimAsanDeathTest, DynamicSharedMemoryOverflowIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::vector<float> out(64, 0.f);
        lt::launch_kernel(smem_past_end_kernel, dim3(1), dim3(64), 63 * sizeof(float), nullptr, out.data());
      },
      "heap-buffer-overflow(.|\n)*smem_past_end_kernel");
}

// A 16-byte vector load from an address that is only 2-byte aligned: fine on x86, a misaligned
// address fault on the GPU. UBSan's alignment check (in this build's flags) stops the kernel there.
__global__ void misaligned_vector_load_kernel(uint4* out, const __nv_bfloat16* in) {
  out[threadIdx.x] = *reinterpret_cast<const uint4*>(in + 8 * threadIdx.x);
}

TEST(SimAsan, AlignedVectorLoadsAreClean) {
  alignas(16) __nv_bfloat16 in[8 * 4 + 1] = {};
  uint4 out[4];
  lt::launch_kernel(misaligned_vector_load_kernel, dim3(1), dim3(4), 0, nullptr, out, in);
  SUCCEED();
}

TEST(SimAsanDeathTest, MisalignedVectorLoadIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        alignas(16) __nv_bfloat16 in[8 * 4 + 1] = {};
        uint4 out[4];
        lt::launch_kernel(misaligned_vector_load_kernel, dim3(1), dim3(4), 0, nullptr, out, in + 1);
      },
      "misaligned address 0x[0-9a-f]+ for type 'const (struct )?uint4', which requires 16 byte alignment");
}

}  // namespace
