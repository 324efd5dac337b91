// cuBLASLt plans of the CUDA backend (src/backend/cuda/matmul.cu) on cuda-sim: built once per
// problem and operand alignment and reused (device_counters().plans_built), with the operands'
// alignments in the preference; the simulator's cuBLASLt (cublaslt_sim.cpp) refuses an algorithm
// used with pointers less aligned than its preference promised, so a cache that ignored alignment
// would fail here as it could fault on a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cublaslt_api.h"
#include "cuda_test_util.h"
#include "backend/cuda/device.h"

namespace {

using lt::cuda::DeviceBuffer;

constexpr unsigned kSeed = 20261201;
constexpr int N = 5, IC = 24, OC = 16;

uint64_t plans_built() { return lt::cuda::device_counters().plans_built; }

// x (N, IC) placed `shift` elements into a device buffer, w (OC, IC) at the start of another.
struct Operands {
  DeviceBuffer<__nv_bfloat16> x, w, out;
  int shift;
  Operands(const std::vector<__nv_bfloat16>& hx, const std::vector<__nv_bfloat16>& hw, int shift_elems)
      : x(hx.size() + shift_elems), w(hw.size()), out(size_t(N) * OC + 8), shift(shift_elems) {
    lt::cuda::copy_to_device(x.data() + shift, hx.data(), hx.size() * sizeof(__nv_bfloat16));
    lt::cuda::copy_to_device(w.data(), hw.data(), hw.size() * sizeof(__nv_bfloat16));
  }
  std::vector<__nv_bfloat16> forward() {
    lt::cuda::matmul_forward(out.data(), x.data() + shift, w.data(), N, IC, OC, nullptr);
    std::vector<__nv_bfloat16> h(size_t(N) * OC);
    lt::cuda::copy_to_host(h.data(), out.data(), h.size() * sizeof(__nv_bfloat16));
    return h;
  }
};

using lt::cudatest::random_bf16;

TEST(MatmulPlans, BuiltOncePerShapeAndAlignment) {
  std::printf("seed %u, forward %dx%dx%d\n", kSeed, N, IC, OC);
  std::mt19937 rng(kSeed);
  const auto hx = random_bf16(size_t(N) * IC, rng), hw = random_bf16(size_t(OC) * IC, rng);
  Operands aligned(hx, hw, 0), again(hx, hw, 0), by16(hx, hw, 8), by2(hx, hw, 1);
  const uint64_t p0 = plans_built();
  const auto want = aligned.forward();
  auto same_bits = [&](const std::vector<__nv_bfloat16>& got) {
    return std::memcmp(got.data(), want.data(), want.size() * sizeof(__nv_bfloat16)) == 0;
  };
  EXPECT_EQ(plans_built() - p0, 1u) << "the first product of a shape builds its plan";
  EXPECT_TRUE(same_bits(aligned.forward()));
  EXPECT_TRUE(same_bits(again.forward()));
  EXPECT_EQ(plans_built() - p0, 1u) << "same shape, same 256-byte alignment: the plan is reused";
  EXPECT_TRUE(same_bits(by16.forward())) << "x 16-byte aligned";
  EXPECT_EQ(plans_built() - p0, 2u) << "x 16-byte aligned: a plan of its own";
  EXPECT_TRUE(same_bits(by2.forward())) << "x 2-byte aligned";
  EXPECT_EQ(plans_built() - p0, 3u) << "x 2-byte aligned: a plan of its own";
  for (int rep = 0; rep < 3; ++rep) {
    EXPECT_TRUE(same_bits(by2.forward()));
    EXPECT_TRUE(same_bits(by16.forward()));
    EXPECT_TRUE(same_bits(aligned.forward()));
  }
  EXPECT_EQ(plans_built() - p0, 3u) << "every plan reused";
  // The backward pass: dx and dw, one plan each, then reused.
  DeviceBuffer<__nv_bfloat16> dx(size_t(N) * IC);
  DeviceBuffer<float> dw(size_t(OC) * IC);
  lt::cuda::device_memset(dw.data(), 0, dw.size() * sizeof(float));
  lt::cuda::matmul_backward(dx.data(), dw.data(), aligned.out.data(), aligned.x.data(), aligned.w.data(), N, IC, OC,
                            nullptr);
  EXPECT_EQ(plans_built() - p0, 5u);
  lt::cuda::matmul_backward(dx.data(), dw.data(), aligned.out.data(), aligned.x.data(), aligned.w.data(), N, IC, OC,
                            nullptr);
  EXPECT_EQ(plans_built() - p0, 5u);
  lt::cuda::device_synchronize();
}

// The raw API: an algorithm found with the default preference (256-byte operands) is refused for a
// 2-byte-aligned A; one found with CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 2 is accepted.
TEST(MatmulPlans, AnAlgorithmIsRefusedForLessAlignedOperands) {
  const lt::cuda::CublasLtApi& api = lt::cuda::cublaslt_api();
  DeviceBuffer<__nv_bfloat16> A(6 * 4 + 1), B(4 * 5);
  DeviceBuffer<float> D(6 * 5);
  lt::cuda::device_memset(A.data(), 0, A.size() * 2);
  lt::cuda::device_memset(B.data(), 0, B.size() * 2);
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  ASSERT_EQ(api.cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(api.cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(api.cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 6, 4, 6), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(api.cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, 4, 5, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(api.cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 6, 5, 6), CUBLAS_STATUS_SUCCESS);
  auto run_with = [&](uint32_t align_a) {
    cublasLtMatmulPreference_t pref = nullptr;
    EXPECT_EQ(api.cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    if (align_a) {
      EXPECT_EQ(api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                         sizeof align_a),
                CUBLAS_STATUS_SUCCESS);
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    EXPECT_EQ(api.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &result, &found),
              CUBLAS_STATUS_SUCCESS);
    api.cublasLtMatmulPreferenceDestroy(pref);
    const float one = 1.f, zero = 0.f;
    return api.cublasLtMatmul(handle, desc, &one, A.data() + 1, la, B.data(), lb, &zero, D.data(), ld, D.data(), ld,
                              &result.algo, nullptr, 0, nullptr);
  };
  EXPECT_EQ(run_with(0), CUBLAS_STATUS_INVALID_VALUE) << "the default preference promises 256-byte operands";
  EXPECT_EQ(run_with(4), CUBLAS_STATUS_INVALID_VALUE) << "A is 2-byte aligned, the preference said 4";
  EXPECT_EQ(run_with(2), CUBLAS_STATUS_SUCCESS);
  lt::cuda::device_synchronize();
  api.cublasLtMatrixLayoutDestroy(la);
  api.cublasLtMatrixLayoutDestroy(lb);
  api.cublasLtMatrixLayoutDestroy(ld);
  api.cublasLtMatmulDescDestroy(desc);
}

}  // namespace
