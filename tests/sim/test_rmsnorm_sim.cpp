// kernels/rmsnorm.cu under the CUDA simulator, against the CPU backend (lt::cpu::rmsnorm_*) and an
// fp64 reference. Inputs are rounded to bf16 first; every reference sees the same rounded values.
// Low-precision rule (STYLE.md): the kernel's worst error against fp64 is at most 2x that of the
// naive bf16 computation (float math on the bf16 inputs, result rounded to bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernel_cases.h"
#include "llamatrain/ops_cpu.h"
#include "rmsnorm.cuh"
#include "sim_test_util.h"

namespace {

using lt::simtest::bf;
using lt::simtest::Bf16Matrix;
using lt::simtest::random_bf16;
using lt::simtest::describe;
using lt::simtest::ErrorReport;
using lt::simtest::kPad;
using lt::simtest::kSentinel;

constexpr float kEps = 1e-5f;

using Shape = lt::kernelcases::Rmsnorm;

TEST(RmsnormSim, ForwardMatchesCpuAndFp64) {
  for (const Shape& s : lt::kernelcases::kRmsnorm) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    const unsigned seed = s.seed(1);
    std::printf("[rmsnorm fwd] N=%d C=%d seed=%u\n", s.N, s.C, seed);
    std::mt19937 rng(seed);
    const Bf16Matrix x = random_bf16(s.N, s.C, rng, 1.5f);
    const Bf16Matrix w = random_bf16(1, s.C, rng, 1.0f);
    Bf16Matrix out(s.N, s.C);
    std::vector<float> rstd(s.N + 1, kSentinel);

    lt::cuda::RmsnormForwardParams p;
    p.out = out.data.data();
    p.rstd = rstd.data();
    p.x = x.data.data();
    p.weight = w.data.data();
    p.N = s.N, p.C = s.C;
    p.x_row_stride = x.stride, p.out_row_stride = out.stride;
    p.eps = kEps;
    lt::cuda::rmsnorm_forward_cuda(p, nullptr);

    // References on the same bf16 inputs: the CPU backend in fp32 and in fp64.
    std::vector<float> xf(s.N * s.C), wf(s.C), out32(s.N * s.C), rstd32(s.N);
    std::vector<double> xd(s.N * s.C), wd(s.C), out64(s.N * s.C), rstd64(s.N);
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c) xf[i * s.C + c] = x.get(i, c), xd[i * s.C + c] = x.get(i, c);
    for (int c = 0; c < s.C; ++c) wf[c] = w.get(0, c), wd[c] = w.get(0, c);
    lt::cpu::rmsnorm_forward(out32.data(), rstd32.data(), xf.data(), wf.data(), s.N, s.C, kEps);
    lt::cpu::rmsnorm_forward(out64.data(), rstd64.data(), xd.data(), wd.data(), s.N, s.C, kEps);

    ErrorReport kernel_err, naive_err, cpu_err, rstd_err;
    for (int i = 0; i < s.N; ++i) {
      rstd_err.add(i, 0, rstd[i] / rstd64[i] - 1.0, 0.0);
      for (int c = 0; c < s.C; ++c) {
        const double ref = out64[i * s.C + c];
        kernel_err.add(i, c, out.get(i, c), ref);
        naive_err.add(i, c, bf(out32[i * s.C + c]), ref);  // naive = fp32 CPU result rounded to bf16
        cpu_err.add(i, c, out.get(i, c), bf(out32[i * s.C + c]));
      }
    }
    std::printf("  %s\n  %s\n  %s\n  rstd worst relative error %.3e; kernel/naive ratio %.3f\n",
                describe("kernel vs fp64", kernel_err).c_str(), describe("naive bf16 vs fp64", naive_err).c_str(),
                describe("kernel vs cpu fp32 (bf16-rounded)", cpu_err).c_str(), rstd_err.worst,
                naive_err.worst > 0 ? kernel_err.worst / naive_err.worst : 0.0);
    EXPECT_TRUE(kernel_err.finite) << "N=" << s.N << " C=" << s.C;
    EXPECT_LE(kernel_err.worst, 2.0 * naive_err.worst) << describe("kernel vs fp64", kernel_err);
    // fp32 sum of C squares: relative error grows with the reduction length (STYLE.md).
    EXPECT_LE(rstd_err.worst, 1e-6 * (4 + std::sqrt(static_cast<double>(s.C))));
    EXPECT_EQ(out.touched_padding(), 0) << "N=" << s.N << " C=" << s.C;
    EXPECT_EQ(rstd[s.N], kSentinel) << "rstd written past N";
  }
}

TEST(RmsnormSim, BackwardMatchesCpuAndFp64) {
  for (const Shape& s : lt::kernelcases::kRmsnorm) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    const unsigned seed = s.seed(2);
    std::printf("[rmsnorm bwd] N=%d C=%d seed=%u\n", s.N, s.C, seed);
    std::mt19937 rng(seed);
    const Bf16Matrix x = random_bf16(s.N, s.C, rng, 1.5f);
    const Bf16Matrix w = random_bf16(1, s.C, rng, 1.0f);
    const Bf16Matrix dout = random_bf16(s.N, s.C, rng, 0.5f);

    std::vector<float> xf(s.N * s.C), wf(s.C), gf(s.N * s.C);
    std::vector<double> xd(s.N * s.C), wd(s.C), gd(s.N * s.C);
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c) {
        xf[i * s.C + c] = xd[i * s.C + c] = x.get(i, c);
        gf[i * s.C + c] = gd[i * s.C + c] = dout.get(i, c);
      }
    for (int c = 0; c < s.C; ++c) wf[c] = wd[c] = w.get(0, c);
    // One rstd cache (fp32, as the forward kernel stores it) for every computation.
    std::vector<float> tmp32(s.N * s.C), rstd(s.N);
    lt::cpu::rmsnorm_forward(tmp32.data(), rstd.data(), xf.data(), wf.data(), s.N, s.C, kEps);
    const std::vector<double> rstd_d(rstd.begin(), rstd.end());

    // dweight starts non-zero: the op accumulates.
    std::uniform_real_distribution<float> init(-1.f, 1.f);
    std::vector<float> dw0(s.C + kPad, kSentinel);
    for (int c = 0; c < s.C; ++c) dw0[c] = init(rng);
    std::vector<float> dw = dw0;
    Bf16Matrix dx(s.N, s.C);
    std::vector<float> scratch(lt::cuda::rmsnorm_backward_scratch_floats(s.N, s.C));

    lt::cuda::RmsnormBackwardParams p;
    p.dx = dx.data.data();
    p.dweight = dw.data();
    p.scratch = scratch.data();
    p.dout = dout.data.data();
    p.x = x.data.data();
    p.weight = w.data.data();
    p.rstd = rstd.data();
    p.N = s.N, p.C = s.C;
    p.dx_row_stride = dx.stride, p.dout_row_stride = dout.stride, p.x_row_stride = x.stride;
    lt::cuda::rmsnorm_backward_cuda(p, nullptr);

    std::vector<float> dx32(s.N * s.C), dw32(s.C, 0.f);
    std::vector<double> dx64(s.N * s.C), dw64(s.C, 0.0);
    lt::cpu::rmsnorm_backward(dx32.data(), dw32.data(), gf.data(), xf.data(), wf.data(), rstd.data(), s.N, s.C);
    lt::cpu::rmsnorm_backward(dx64.data(), dw64.data(), gd.data(), xd.data(), wd.data(), rstd_d.data(), s.N, s.C);

    ErrorReport kernel_err, naive_err, dw_err;
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c) {
        kernel_err.add(i, c, dx.get(i, c), dx64[i * s.C + c]);
        naive_err.add(i, c, bf(dx32[i * s.C + c]), dx64[i * s.C + c]);
      }
    bool dw_ok = true;
    for (int c = 0; c < s.C; ++c) {
      // fp32 sums over N rows: bound by eps_f32 * N * sum |terms| (plus the rounding of dw0 + sum).
      double abs_sum = std::fabs(dw0[c]);
      for (int i = 0; i < s.N; ++i) abs_sum += std::fabs(gd[i * s.C + c] * xd[i * s.C + c] * rstd_d[i]);
      const double ref = dw0[c] + dw64[c];
      dw_err.add(0, c, dw[c], ref);
      if (!(std::fabs(dw[c] - ref) <= 1.2e-7 * (s.N + 2) * abs_sum)) dw_ok = false;
    }
    std::printf("  %s\n  %s\n  %s\n  dx kernel/naive ratio %.3f\n", describe("dx kernel vs fp64", kernel_err).c_str(),
                describe("dx naive bf16 vs fp64", naive_err).c_str(), describe("dweight (fp32) vs fp64", dw_err).c_str(),
                naive_err.worst > 0 ? kernel_err.worst / naive_err.worst : 0.0);
    EXPECT_TRUE(kernel_err.finite && dw_err.finite) << "N=" << s.N << " C=" << s.C;
    EXPECT_LE(kernel_err.worst, 2.0 * naive_err.worst) << describe("dx kernel vs fp64", kernel_err);
    EXPECT_TRUE(dw_ok) << describe("dweight (fp32) vs fp64", dw_err);
    EXPECT_EQ(dx.touched_padding(), 0) << "N=" << s.N << " C=" << s.C;
    for (int c = s.C; c < s.C + kPad; ++c) EXPECT_EQ(dw[c], kSentinel) << "dweight written past C";
  }
}

// The dweight sum has a fixed order: two runs give identical bits.
TEST(RmsnormSim, BackwardIsDeterministic) {
  const int N = 80, C = 96;  // two row chunks
  std::mt19937 rng(42);
  std::printf("[rmsnorm bwd determinism] N=%d C=%d seed=42\n", N, C);
  const Bf16Matrix x = random_bf16(N, C, rng, 1.f), w = random_bf16(1, C, rng, 1.f),
                   dout = random_bf16(N, C, rng, 1.f);
  std::vector<float> rstd(N, 0.7f), scratch(lt::cuda::rmsnorm_backward_scratch_floats(N, C));
  std::vector<float> dw_a(C, 0.f), dw_b(C, 0.f);
  Bf16Matrix dx(N, C);
  lt::cuda::RmsnormBackwardParams p;
  p.dx = dx.data.data(), p.scratch = scratch.data(), p.dout = dout.data.data(), p.x = x.data.data();
  p.weight = w.data.data(), p.rstd = rstd.data(), p.N = N, p.C = C;
  p.dx_row_stride = dx.stride, p.dout_row_stride = dout.stride, p.x_row_stride = x.stride;
  p.dweight = dw_a.data();
  lt::cuda::rmsnorm_backward_cuda(p, nullptr);
  p.dweight = dw_b.data();
  lt::cuda::rmsnorm_backward_cuda(p, nullptr);
  EXPECT_EQ(dw_a, dw_b);
  EXPECT_NE(dw_a, std::vector<float>(C, 0.f));
}

}  // namespace
