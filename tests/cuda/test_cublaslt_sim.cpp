// The CUDA backend's matrix products (src/backend/cuda/matmul.cu) as CI runs them: the GPU build's
// cuBLASLt descriptor code, answered by the simulator's interpreter (cublaslt_sim.cpp).
// * Numbers: forward, dx and the += dw against an fp64 product of the same bf16 inputs, on shapes that
//   are not multiples of the 8-wide summation. Tolerance: bf16 outputs within one rounding (2^-8
//   relative to the element, the tie-free bound of round-to-nearest at 8 significant bits) plus the
//   fp32 accumulation bound k * 2^-24 * sum|a_i b_i|; fp32 dw within the accumulation bound alone.
// * One summation order: the same bits with 1, 2 and 3 OpenMP threads.
// * Descriptors checked as the library checks them: a transposed operand, a leading dimension below
//   the rows, a host pointer, an extent past the allocation, a mismatched algorithm: each refused.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cublaslt_api.h"
#include "cuda_test_util.h"
#include "backend/cuda/device.h"

namespace {

using lt::cuda::DeviceBuffer;

using lt::cudatest::random_bf16;
template <class T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(h.size());
  lt::cuda::copy_to_device(d.data(), h.data(), h.size() * sizeof(T));
  return d;
}
template <class T>
std::vector<T> download(const DeviceBuffer<T>& d) {
  std::vector<T> h(d.size());
  lt::cuda::copy_to_host(h.data(), d.data(), h.size() * sizeof(T));
  return h;
}
double f(__nv_bfloat16 x) { return __bfloat162float(x); }

// Row-major reference: out (N,OC) = x (N,IC) w^T in fp64, and sum |x_i w_i| for the bound.
struct Reference {
  std::vector<double> value, abs_sum;
};
Reference product(const std::vector<double>& a, const std::vector<double>& b, int rows, int cols, int k,
                  bool b_transposed) {
  // a (rows, k) row-major; b (cols, k) if b_transposed else (k, cols).
  Reference r{std::vector<double>(size_t(rows) * cols), std::vector<double>(size_t(rows) * cols)};
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      for (int kk = 0; kk < k; ++kk) {
        const double p = a[size_t(i) * k + kk] * (b_transposed ? b[size_t(j) * k + kk] : b[size_t(kk) * cols + j]);
        r.value[size_t(i) * cols + j] += p;
        r.abs_sum[size_t(i) * cols + j] += std::abs(p);
      }
  return r;
}

// Worst |got - want| / bound over all elements; fails if above 1.
template <class Got>
void expect_within(const char* what, const std::vector<Got>& got, const Reference& want, int k, bool bf16_out,
                   const std::vector<double>& added = {}) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]);
    const double w = want.value[i] + (added.empty() ? 0.0 : added[i]);
    const double bound = k * std::ldexp(1.0, -24) * want.abs_sum[i] + (bf16_out ? std::ldexp(std::abs(w), -8) : 0.0) +
                         1e-30;
    const double r = std::abs(g - w) / bound;
    if (r > worst) worst = r, at = i;
  }
  std::printf("[ %s ] worst error %.3g of its bound at element %zu\n", what, worst, at);
  EXPECT_LE(worst, 1.0) << what << ": element " << at;
}

struct Shape {
  int N, IC, OC;
};

TEST(CublasLtSim, ProductsMatchFp64OnOddShapes) {
  const unsigned seed = 20261201;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (const Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 64, 17}, Shape{128, 72, 200}}) {
    const auto x = random_bf16(size_t(s.N) * s.IC, rng), w = random_bf16(size_t(s.OC) * s.IC, rng);
    const auto dout = random_bf16(size_t(s.N) * s.OC, rng);
    std::vector<float> dw0(size_t(s.OC) * s.IC);
    for (auto& v : dw0) v = std::normal_distribution<float>(0.f, 1.f)(rng);
    auto dx_ = upload(x), dw_ = upload(w), ddout = upload(dout);
    auto ddw = upload(dw0);
    DeviceBuffer<__nv_bfloat16> dout_fwd(size_t(s.N) * s.OC), ddx(size_t(s.N) * s.IC);
    lt::cuda::matmul_forward(dout_fwd.data(), dx_.data(), dw_.data(), s.N, s.IC, s.OC, nullptr);
    lt::cuda::matmul_backward(ddx.data(), ddw.data(), ddout.data(), dx_.data(), dw_.data(), s.N, s.IC, s.OC, nullptr);

    std::vector<double> xd(x.size()), wd(w.size()), gd(dout.size()), xt(x.size()), gt(dout.size());
    for (size_t i = 0; i < x.size(); ++i) xd[i] = f(x[i]);
    for (size_t i = 0; i < w.size(); ++i) wd[i] = f(w[i]);
    for (size_t i = 0; i < dout.size(); ++i) gd[i] = f(dout[i]);
    // x^T (IC, N) and dout^T (OC, N), row-major, for dw = dout^T x.
    for (int n = 0; n < s.N; ++n) {
      for (int c = 0; c < s.IC; ++c) xt[size_t(c) * s.N + n] = xd[size_t(n) * s.IC + c];
      for (int o = 0; o < s.OC; ++o) gt[size_t(o) * s.N + n] = gd[size_t(n) * s.OC + o];
    }
    std::printf("N %d IC %d OC %d\n", s.N, s.IC, s.OC);
    std::vector<double> out_got, dx_got;
    for (auto v : download(dout_fwd)) out_got.push_back(f(v));
    for (auto v : download(ddx)) dx_got.push_back(f(v));
    expect_within("forward", out_got, product(xd, wd, s.N, s.OC, s.IC, true), s.IC, true);
    expect_within("dx", dx_got, product(gd, wd, s.N, s.IC, s.OC, false), s.OC, true);
    const std::vector<double> dw_before(dw0.begin(), dw0.end());
    expect_within("dw +=", download(ddw), product(gt, xt, s.OC, s.IC, s.N, true), s.N, false, dw_before);
  }
}

TEST(CublasLtSim, SameBitsForAnyThreadCount) {
  std::mt19937 rng(7);
  const int N = 96, IC = 88, OC = 72;
  const auto x = random_bf16(size_t(N) * IC, rng), w = random_bf16(size_t(OC) * IC, rng);
  const auto dout = random_bf16(size_t(N) * OC, rng);
  auto dx_ = upload(x), dw_ = upload(w), ddout = upload(dout);
  std::vector<std::vector<float>> dws;
  std::vector<std::vector<__nv_bfloat16>> outs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    DeviceBuffer<__nv_bfloat16> out(size_t(N) * OC);
    DeviceBuffer<float> dw(size_t(OC) * IC);
    lt::cuda::device_memset(dw.data(), 0, dw.size() * sizeof(float));
    lt::cuda::matmul_forward(out.data(), dx_.data(), dw_.data(), N, IC, OC, nullptr);
    lt::cuda::matmul_backward(nullptr, dw.data(), ddout.data(), dx_.data(), dw_.data(), N, IC, OC, nullptr);
    outs.push_back(download(out));
    dws.push_back(download(dw));
  }
  for (size_t t = 1; t < outs.size(); ++t) {
    EXPECT_EQ(std::memcmp(outs[t].data(), outs[0].data(), outs[0].size() * 2), 0) << "forward, thread count " << t + 1;
    EXPECT_EQ(std::memcmp(dws[t].data(), dws[0].data(), dws[0].size() * 4), 0) << "dw, thread count " << t + 1;
  }
}

// The raw API, to break a call on purpose the way a bug in matmul.cu would.
struct RawCall {
  const lt::cuda::CublasLtApi& api = lt::cuda::cublaslt_api();
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  // D (m,n) = op(A) op(B); A and B bf16, D fp32, as given (rows x cols, ld) per layout.
  RawCall(cublasOperation_t ta, cublasOperation_t tb, int ar, int ac, int lda, int br, int bc, int ldb, int m, int n) {
    EXPECT_EQ(api.cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(api.cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    EXPECT_EQ(api.cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, ar, ac, lda), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(api.cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, br, bc, ldb), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(api.cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, m, n, m), CUBLAS_STATUS_SUCCESS);
    api.cublasLtMatmulPreferenceCreate(&pref);
  }
  ~RawCall() {
    api.cublasLtMatmulPreferenceDestroy(pref);
    api.cublasLtMatrixLayoutDestroy(a);
    api.cublasLtMatrixLayoutDestroy(b);
    api.cublasLtMatrixLayoutDestroy(d);
    api.cublasLtMatmulDescDestroy(desc);
  }
  cublasStatus_t heuristic() {
    int found = 0;
    return api.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, &result, &found);
  }
  cublasStatus_t run(const void* A, const void* B, void* D) {
    const float one = 1.f, zero = 0.f;
    return api.cublasLtMatmul(handle, desc, &one, A, a, B, b, &zero, D, d, D, d, &result.algo, nullptr, 0, nullptr);
  }
};

TEST(CublasLtSim, BrokenCallsAreRefused) {
  DeviceBuffer<__nv_bfloat16> A(6 * 4), B(4 * 5);
  DeviceBuffer<float> D(6 * 5);
  lt::cuda::device_memset(A.data(), 0, A.size() * 2);
  lt::cuda::device_memset(B.data(), 0, B.size() * 2);
  {
    RawCall ok(CUBLAS_OP_N, CUBLAS_OP_N, 6, 4, 6, 4, 5, 4, 6, 5);  // (6x4)(4x5)
    ASSERT_EQ(ok.heuristic(), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(ok.run(A.data(), B.data(), D.data()), CUBLAS_STATUS_SUCCESS);
    std::vector<float> host_d(D.size());
    EXPECT_NE(ok.run(A.data(), B.data(), host_d.data()), CUBLAS_STATUS_SUCCESS) << "a host pointer for D";
    DeviceBuffer<float> small(6 * 5 - 1);
    EXPECT_NE(ok.run(A.data(), B.data(), small.data()), CUBLAS_STATUS_SUCCESS) << "D one element past its allocation";
    EXPECT_NE(ok.run(reinterpret_cast<const char*>(A.data()) + 1, B.data(), D.data()), CUBLAS_STATUS_SUCCESS)
        << "a misaligned A";
  }
  {
    RawCall transposed(CUBLAS_OP_T, CUBLAS_OP_N, 6, 4, 6, 4, 5, 4, 6, 5);  // op(A) 4x6: k does not match
    EXPECT_EQ(transposed.heuristic(), CUBLAS_STATUS_INVALID_VALUE);
  }
  {
    const lt::cuda::CublasLtApi& api = lt::cuda::cublaslt_api();
    cublasLtMatrixLayout_t l = nullptr;
    EXPECT_EQ(api.cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 6, 4, 5), CUBLAS_STATUS_INVALID_VALUE)
        << "leading dimension below the rows";
  }
  {
    RawCall first(CUBLAS_OP_N, CUBLAS_OP_N, 6, 4, 6, 4, 5, 4, 6, 5);
    ASSERT_EQ(first.heuristic(), CUBLAS_STATUS_SUCCESS);
    RawCall other(CUBLAS_OP_N, CUBLAS_OP_N, 6, 2, 6, 2, 5, 2, 6, 5);  // k = 2
    other.result = first.result;                                     // a plan cached for another shape
    EXPECT_EQ(other.run(A.data(), B.data(), D.data()), CUBLAS_STATUS_INVALID_VALUE);
  }
}

// A square product with A's operation flipped is accepted by every shape check; the numbers show it.
TEST(CublasLtSim, AFlippedTransposeGivesOtherNumbers) {
  std::mt19937 rng(3);
  const int n = 16;
  const auto a = random_bf16(n * n, rng), b = random_bf16(n * n, rng);
  auto A = upload(a), B = upload(b);
  DeviceBuffer<float> D1(n * n), D2(n * n);
  RawCall right(CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, n, n, n, n, n), flipped(CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, n, n, n, n, n);
  ASSERT_EQ(right.heuristic(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(flipped.heuristic(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(right.run(A.data(), B.data(), D1.data()), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(flipped.run(A.data(), B.data(), D2.data()), CUBLAS_STATUS_SUCCESS);
  // D1(i,j) = sum_k A(i,k) B(k,j), column-major.
  const auto d1 = download(D1), d2 = download(D2);
  double worst1 = 0, worst2 = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double r1 = 0, r2 = 0;
      for (int k = 0; k < n; ++k) {
        r1 += f(a[i + k * n]) * f(b[k + j * n]);
        r2 += f(a[k + i * n]) * f(b[k + j * n]);
      }
      worst1 = std::max(worst1, std::abs(d1[i + j * n] - r1));
      worst2 = std::max(worst2, std::abs(d2[i + j * n] - r2));
    }
  EXPECT_LT(worst1, 1e-4);
  EXPECT_LT(worst2, 1e-4);
  double differ = 0;
  for (int i = 0; i < n * n; ++i) differ = std::max(differ, double(std::abs(d1[i] - d2[i])));
  EXPECT_GT(differ, 0.1) << "TRANSA was ignored";
}

}  // namespace
