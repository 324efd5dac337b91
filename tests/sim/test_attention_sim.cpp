// kernels/attention.cu (the CUDA-core kernels, AttentionKernel::kCudaCores, for every head dim;
// the tensor-core path of head_dim 64/128 is test_attention_tc_sim.cpp) under the CUDA simulator, against the CPU backend (lt::cpu::attention_*)
// in fp32 and fp64. q, k, v, dout are bf16; every reference sees the same bf16 values, and the
// backward references get the kernel's own forward outputs (bf16 out, fp32 lse) as inputs, as the
// kernel does. Low-precision rule (STYLE.md): the kernel's worst error against fp64 is at most 2x
// that of the naive bf16 computation (the fp32 CPU op's result rounded to bf16). Every bf16 output
// element is also held to the CPU fp32 result within bf16 rounding, and the fp32 lse to fp64 within
// an fp32 bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.cuh"
#include "attention_test_util.h"
#include "llamatrain/ops_cpu.h"
#include "sim_test_util.h"

namespace {

using namespace lt::simtest::attention;  // NOLINT: Case, Shape, sim_shapes, ...
using lt::simtest::bf;
using lt::simtest::describe;
using lt::simtest::ErrorReport;
using lt::simtest::kPad;
using lt::simtest::kSentinel;

double ratio(const ErrorReport& a, const ErrorReport& n) { return n.worst > 0 ? a.worst / n.worst : 0.0; }

// The rule (attention_test_util.h, compare without operand terms): |kernel - fp32| <= 2^-8 |fp32|
// (round to nearest bf16: half an ulp is at most 2^-8 of the value) + 1e-5 max|fp32| (the two fp32
// results differ only by summation order), and the worst error within 2x the naive bf16 one.
void expect_close(const char* name, const Comparison& c) {
  std::printf("  %s\n  %s\n  %s kernel/naive ratio %.3g, %d elements beyond bf16 rounding of fp32\n",
              describe((std::string(name) + " kernel vs fp64").c_str(), c.kernel).c_str(),
              describe((std::string(name) + " naive bf16 vs fp64").c_str(), c.naive).c_str(), name,
              ratio(c.kernel, c.naive), c.violations);
  EXPECT_TRUE(c.kernel.finite) << name << " has NaN/Inf";
  EXPECT_LE(c.kernel.worst, 2.0 * c.naive.worst) << describe(name, c.kernel);
  EXPECT_EQ(c.violations, 0) << name << " first: " << c.first_violation;
}

TEST(AttentionSim, ForwardMatchesCpuAndFp64) {
  for (const Shape& s : sim_shapes()) {
    const unsigned seed = seed_for(s, 1);
    print_case("fwd", s, seed);
    Case k(s);
    k.kernel = AttentionKernel::kCudaCores;
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);

    const std::vector<float> q32 = k.q.dense<float>(), k32 = k.k.dense<float>(), v32 = k.v.dense<float>();
    const std::vector<double> q64 = k.q.dense<double>(), k64 = k.k.dense<double>(), v64 = k.v.dense<double>();
    std::vector<float> out32(q32.size()), lse32(static_cast<size_t>(s.B) * s.H * s.T);
    std::vector<double> out64(q32.size()), lse64(lse32.size());
    lt::cpu::attention_forward(out32.data(), lse32.data(), q32.data(), k32.data(), v32.data(), k.seg_ptr(), s.B, s.T,
                               s.H, s.KVH, s.hd);
    lt::cpu::attention_forward(out64.data(), lse64.data(), q64.data(), k64.data(), v64.data(), k.seg_ptr(), s.B, s.T,
                               s.H, s.KVH, s.hd);

    expect_close("out", compare(View{&k.out, 0, s.H}, out32, out64));

    // lse (fp32): the scores' rounding error is about hd * 2^-24 * sum_d |q_d k_d| / sqrt(hd) <= 2^-24 hd
    // max|q| max|k| sqrt(hd), the log-sum-exp adds a few ulps of |lse| and T ulps of the sum.
    double qmax = 0, kmax = 0;
    for (float x : q32) qmax = std::max(qmax, static_cast<double>(std::fabs(x)));
    for (float x : k32) kmax = std::max(kmax, static_cast<double>(std::fabs(x)));
    const double score_err = std::ldexp(1.0, -24) * s.hd * qmax * kmax * std::sqrt(static_cast<double>(s.hd));
    ErrorReport lse_err;
    int lse_bad = 0, inf_mismatch = 0;
    for (size_t i = 0; i < lse64.size(); ++i) {
      if (std::isinf(lse64[i])) {  // an empty row: -inf in both
        if (!(std::isinf(k.lse[i]) && k.lse[i] < 0)) ++inf_mismatch;
        continue;
      }
      lse_err.add(static_cast<int>(i), 0, k.lse[i], lse64[i]);
      const double tol = score_err + std::ldexp(1.0, -22) * (std::fabs(lse64[i]) + s.T);
      if (!(std::fabs(k.lse[i] - lse64[i]) <= tol)) ++lse_bad;
    }
    std::printf("  %s (score error bound %.3g)\n", describe("lse kernel vs fp64", lse_err).c_str(), score_err);
    EXPECT_TRUE(lse_err.finite);
    EXPECT_EQ(lse_bad, 0) << describe("lse", lse_err);
    EXPECT_EQ(inf_mismatch, 0) << "empty rows must have lse = -inf";
    EXPECT_EQ(k.out.touched_padding(), 0) << "out padding written";
    for (int i = 0; i < kPad; ++i) EXPECT_EQ(k.lse[lse64.size() + i], kSentinel) << "lse written past B*H*T";
  }
}

TEST(AttentionSim, BackwardMatchesCpuAndFp64) {
  for (const Shape& s : sim_shapes()) {
    const unsigned seed = seed_for(s, 2);
    print_case("bwd", s, seed);
    Case k(s);
    k.kernel = AttentionKernel::kCudaCores;
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);
    lt::cuda::attention_backward_cuda(p, nullptr);

    const size_t n_stat = static_cast<size_t>(s.B) * s.H * s.T;
    const View out{&k.out, 0, s.H}, dout{&k.dout, 0, s.H};
    const std::vector<float> q32 = k.q.dense<float>(), k32 = k.k.dense<float>(), v32 = k.v.dense<float>();
    const std::vector<float> o32 = out.dense<float>(), do32 = dout.dense<float>();
    const std::vector<float> lse32(k.lse.begin(), k.lse.begin() + n_stat);
    const std::vector<double> q64 = k.q.dense<double>(), k64 = k.k.dense<double>(), v64 = k.v.dense<double>();
    const std::vector<double> o64 = out.dense<double>(), do64 = dout.dense<double>();
    const std::vector<double> lse64(lse32.begin(), lse32.end());
    std::vector<float> dq32(q32.size()), dk32(k32.size()), dv32(v32.size());
    std::vector<double> dq64(q32.size()), dk64(k32.size()), dv64(v32.size());
    lt::cpu::attention_backward(dq32.data(), dk32.data(), dv32.data(), do32.data(), o32.data(), lse32.data(),
                                q32.data(), k32.data(), v32.data(), k.seg_ptr(), s.B, s.T, s.H, s.KVH, s.hd);
    lt::cpu::attention_backward(dq64.data(), dk64.data(), dv64.data(), do64.data(), o64.data(), lse64.data(),
                                q64.data(), k64.data(), v64.data(), k.seg_ptr(), s.B, s.T, s.H, s.KVH, s.hd);

    expect_close("dq", compare(k.dq, dq32, dq64));
    expect_close("dk", compare(k.dk, dk32, dk64));
    expect_close("dv", compare(k.dv, dv32, dv64));
    EXPECT_EQ(k.dqkv_buf.touched_padding(), 0) << "dq (dqkv) padding written";
    EXPECT_EQ(k.dk_buf.touched_padding(), 0) << "dk padding written";
    EXPECT_EQ(k.dv_buf.touched_padding(), 0) << "dv padding written";
    for (int i = 0; i < kPad; ++i) EXPECT_EQ(k.dsum[n_stat + i], kSentinel) << "dsum written past B*H*T";
  }
}

// The backward pass twice, the second time over outputs and scratch prefilled with NaN: the
// same bits (no order-dependent sums, no reads of stale output or scratch contents).
TEST(AttentionSim, BackwardIsDeterministic) {
  const Shape shapes[] = {{1, 100, 4, 2, 64, Seg::kPacked, false, 0, 1.f}, {1, 70, 4, 1, 128, Seg::kNone, true, 0, 1.f}};
  for (const Shape& s : shapes) {
    const unsigned seed = seed_for(s, 3);
    print_case("determinism", s, seed);
    Case k(s);
    k.kernel = AttentionKernel::kCudaCores;
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);
    lt::cuda::attention_backward_cuda(p, nullptr);
    const Heads dqkv1 = k.dqkv_buf, dk1 = k.dk_buf, dv1 = k.dv_buf;
    const std::vector<float> dsum1 = k.dsum;
    const __nv_bfloat16 nan = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
    for (Heads* h : {&k.dqkv_buf, &k.dk_buf, &k.dv_buf})
      for (int r = 0; r < h->rows; ++r)
        for (int hh = 0; hh < h->NH; ++hh)
          for (int c = 0; c < h->hd; ++c) h->data[h->index(r, hh, c)] = nan;
    for (size_t i = 0; i + kPad < k.dsum.size(); ++i) k.dsum[i] = std::numeric_limits<float>::quiet_NaN();
    lt::cuda::attention_backward_cuda(p, nullptr);
    const auto same = [](const Heads& a, const Heads& b) {
      return a.data.size() == b.data.size() &&
             std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(__nv_bfloat16)) == 0;
    };
    EXPECT_TRUE(same(dqkv1, k.dqkv_buf)) << "dq differs between runs";
    EXPECT_TRUE(same(dk1, k.dk_buf)) << "dk differs between runs";
    EXPECT_TRUE(same(dv1, k.dv_buf)) << "dv differs between runs";
    EXPECT_EQ(std::memcmp(dsum1.data(), k.dsum.data(), dsum1.size() * sizeof(float)), 0) << "dsum differs";
  }
}

TEST(AttentionSim, RejectsUnsupportedArguments) {
  Case k({1, 8, 2, 1, 32, Seg::kNone, false, 0, 1.f});
  k.kernel = AttentionKernel::kCudaCores;
  make_inputs(k, 7);
  AttentionParams p = k.params();
  p.hd = 96;
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  EXPECT_THROW(lt::cuda::attention_backward_cuda(p, nullptr), std::invalid_argument);
  try {
    lt::cuda::attention_forward_cuda(p, nullptr);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
  p = k.params();
  p.KVH = 3;
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.q.token_stride += 4;  // not a multiple of 8 elements: 16-byte vectors would be misaligned
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.k.ptr += 1;
  EXPECT_THROW(lt::cuda::attention_backward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.dsum = nullptr;
  EXPECT_THROW(lt::cuda::attention_backward_cuda(p, nullptr), std::invalid_argument);
  p = k.params();
  p.kernel = AttentionKernel::kTensorCores;  // head_dim 32 has no tensor-core kernels
  EXPECT_THROW(lt::cuda::attention_forward_cuda(p, nullptr), std::invalid_argument);
  // Nothing was written by the rejected calls.
  EXPECT_EQ(k.lse[0], kSentinel);
}

}  // namespace
