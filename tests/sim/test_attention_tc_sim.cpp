// The tensor-core attention kernels (kernels/attention_tc.cu: mma.sync bf16, ldmatrix, cp.async;
// head_dim 64 and 128) under the CUDA simulator, which emulates those instructions lane by lane and
// runs the kernels with its race detector on. Every shape of the CUDA-core tests
// (attention_test_util.h, sim_shapes) is run at head_dim 64 and at 128, with random inputs and printed
// seeds, against the CPU backend in fp32 and fp64.
//
// Rules (STYLE.md): the worst error against fp64 is at most 2x that of the naive bf16 computation
// (the fp32 CPU result rounded to bf16). Per element, the kernel is held to the fp32 result within
// what its roundings can explain: like FlashAttention-2 it rounds the mma operands P (forward, dV)
// and dS (dQ, dK) to bf16, each a relative error of at most u = 2^-8, so
//   |kernel - fp32| <= u |fp32| (the output's rounding) + 1.02 u sum_s |a_s x_s| (the operands')
//                      + 1e-5 max|fp32| (fp32 summation order, as in test_attention_sim.cpp)
// where sum_s |a_s x_s| is the product of the rounded operand's and the other operand's absolute
// values, computed here in fp64 (e.g. sum_s P_ts |v_sc| for out). dQ and dK add the fp32 error of
// dS = P (dP - D), which cancels (to exactly 0 for a row with one key): dP and D are fp32 dot
// products of hd terms summed in different orders (mma k-steps; the dsum kernel's shuffle tree),
// each off by at most hd 2^-24 sum_c |terms| (Higham's gamma_n), carried into dQ, dK like the
// operand term. That fp32 term is also the floor of the 2x-naive rule: where the CPU's fp32
// reference cancels exactly (naive error 0), any other summation order has an error of that size.
// The fp32 lse is held to fp64 within the bound of test_attention_sim.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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


// Every shape of sim_shapes() with head_dim replaced by 64 and by 128, in the checked build's forward
// schedule (race detector). The ASan build (out-of-bounds and alignment checks, about 12x slower
// here) runs each shape once, at 64 and 128 in turn, and so do the reverse and random schedules,
// each the other half: every (shape, head_dim) pair still runs in a reordered schedule.
std::vector<Shape> tc_shapes() {
  int keep_parity = -1;  // -1: both head dims; else the shapes i with hd == (i % 2 == keep_parity ? 64 : 128)
#if defined(LLAMATRAIN_SIM_ASAN_BUILD)
  keep_parity = 0;
#else
  const lt::sim::Order order = lt::sim::current_schedule().order;
  if (order != lt::sim::Order::kForward) keep_parity = order == lt::sim::Order::kReverse ? 0 : 1;
#endif
  std::vector<Shape> v;
  int i = 0;
  for (const Shape& s : sim_shapes()) {
    for (const Shape& t : tc_variants(s)) {
      if (keep_parity >= 0 && t.hd != (i % 2 == keep_parity ? 64 : 128)) continue;
      v.push_back(t);
    }
    ++i;
  }
  return v;
}

void expect_close(const char* name, const Comparison& c) {
  const double ratio = c.naive.worst > 0 ? c.kernel.worst / c.naive.worst : 0.0;
  std::printf("  %s\n  %s\n  %s kernel/naive ratio %.3g (bound 2, fp32 floor %.2g), per-element bound used %.3g, "
              "%d beyond\n",
              describe((std::string(name) + " kernel vs fp64").c_str(), c.kernel).c_str(),
              describe((std::string(name) + " naive bf16 vs fp64").c_str(), c.naive).c_str(), name, ratio, c.floor,
              c.worst_bound_use, c.violations);
  EXPECT_TRUE(c.kernel.finite) << name << " has NaN/Inf";
  EXPECT_LE(c.kernel.worst, 2.0 * c.naive.worst + c.floor) << describe(name, c.kernel);
  EXPECT_EQ(c.violations, 0) << name << " first: " << c.first_violation;
}

// lse (fp32) against fp64, the bound of test_attention_sim.cpp.
void expect_lse_close(const Case& k, const std::vector<float>& q32, const std::vector<float>& k32,
                      const std::vector<double>& lse64) {
  const Shape& s = k.s;
  double qmax = 0, kmax = 0;
  for (float x : q32) qmax = std::max(qmax, static_cast<double>(std::fabs(x)));
  for (float x : k32) kmax = std::max(kmax, static_cast<double>(std::fabs(x)));
  const double score_err = std::ldexp(1.0, -24) * s.hd * qmax * kmax * std::sqrt(static_cast<double>(s.hd));
  ErrorReport lse_err;
  int lse_bad = 0, inf_mismatch = 0;
  for (size_t i = 0; i < lse64.size(); ++i) {
    if (std::isinf(lse64[i])) {
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
  for (int i = 0; i < kPad; ++i) EXPECT_EQ(k.lse[lse64.size() + i], kSentinel) << "lse written past B*H*T";
}

TEST(AttentionTcSim, ForwardMatchesCpuAndFp64) {
  for (const Shape& s : tc_shapes()) {
    const unsigned seed = seed_for(s, kTcForwardSalt);
    print_case("tc fwd", s, seed);
    Case k(s);
    k.kernel = AttentionKernel::kTensorCores;
    make_inputs(k, seed);
    lt::cuda::attention_forward_cuda(k.params(), nullptr);

    const std::vector<float> q32 = k.q.dense<float>(), k32 = k.k.dense<float>(), v32 = k.v.dense<float>();
    const std::vector<double> q64 = k.q.dense<double>(), k64 = k.k.dense<double>(), v64 = k.v.dense<double>();
    std::vector<float> out32(q32.size()), lse32(static_cast<size_t>(s.B) * s.H * s.T);
    std::vector<double> out64(q32.size()), lse64(lse32.size());
    lt::cpu::attention_forward(out32.data(), lse32.data(), q32.data(), k32.data(), v32.data(), k.seg_ptr(), s.B, s.T,
                               s.H, s.KVH, s.hd);
    lt::cpu::attention_forward(out64.data(), lse64.data(), q64.data(), k64.data(), v64.data(), k.seg_ptr(), s.B, s.T,
                               s.H, s.KVH, s.hd);
    const Fp64Terms terms = fp64_terms(k, false);
    expect_close("out", compare(View{&k.out, 0, s.H}, out32, out64, terms.out_abs, terms.zero_q));
    expect_lse_close(k, q32, k32, lse64);
    EXPECT_EQ(k.out.touched_padding(), 0) << "out padding written";
  }
}

// The backward from the tensor-core forward's own outputs (bf16 out, fp32 lse), as training runs
// it, with the backward kernels `bwd`, against the CPU backward given the same out and lse.
void check_backward(const Shape& s, unsigned seed, AttentionKernel bwd) {
  Case k(s);
  k.kernel = AttentionKernel::kTensorCores;
  make_inputs(k, seed);
  lt::cuda::attention_forward_cuda(k.params(), nullptr);
  k.kernel = bwd;
  lt::cuda::attention_backward_cuda(k.params(), nullptr);

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
  // The CUDA-core kernels keep P and dS in fp32: no operand-rounding term for them.
  const Fp64Terms terms = fp64_terms(k, true);
  const bool tc = bwd != AttentionKernel::kCudaCores;
  const auto term = [&](const std::vector<double>& t) { return tc ? t : std::vector<double>(t.size(), 0.0); };
  expect_close("dq", compare(k.dq, dq32, dq64, term(terms.dq_abs), terms.dq_f32));
  expect_close("dk", compare(k.dk, dk32, dk64, term(terms.dk_abs), terms.dk_f32));
  expect_close("dv", compare(k.dv, dv32, dv64, term(terms.dv_abs), terms.zero_kv));
  EXPECT_EQ(k.dqkv_buf.touched_padding(), 0) << "dq (dqkv) padding written";
  EXPECT_EQ(k.dk_buf.touched_padding(), 0) << "dk padding written";
  EXPECT_EQ(k.dv_buf.touched_padding(), 0) << "dv padding written";
  for (int i = 0; i < kPad; ++i) EXPECT_EQ(k.dsum[n_stat + i], kSentinel) << "dsum written past B*H*T";
}

TEST(AttentionTcSim, BackwardMatchesCpuAndFp64) {
  for (const Shape& s : tc_shapes()) {
    const unsigned seed = seed_for(s, kTcBackwardSalt);
    print_case("tc bwd", s, seed);
    check_backward(s, seed, AttentionKernel::kTensorCores);
  }
}

// The backward twice, the second time over outputs and scratch prefilled with NaN: the same bits
// (every element summed by one thread in a fixed order; no reads of stale outputs).
TEST(AttentionTcSim, BackwardIsDeterministic) {
  const Shape shapes[] = {{1, 100, 4, 2, 64, Seg::kPacked, false, 0, 1.f}, {1, 70, 4, 1, 128, Seg::kNone, true, 0, 1.f}};
  for (const Shape& s : shapes) {
    const unsigned seed = seed_for(s, 15);
    print_case("tc determinism", s, seed);
    Case k(s);
    k.kernel = AttentionKernel::kTensorCores;
    make_inputs(k, seed);
    const AttentionParams p = k.params();
    lt::cuda::attention_forward_cuda(p, nullptr);
    lt::cuda::attention_backward_cuda(p, nullptr);
    const Heads dqkv1 = k.dqkv_buf, dk1 = k.dk_buf, dv1 = k.dv_buf;
    const __nv_bfloat16 nan = __float2bfloat16(std::nanf(""));
    for (Heads* h : {&k.dqkv_buf, &k.dk_buf, &k.dv_buf})
      for (int r = 0; r < h->rows; ++r)
        for (int hh = 0; hh < h->NH; ++hh)
          for (int c = 0; c < h->hd; ++c) h->data[h->index(r, hh, c)] = nan;
    for (size_t i = 0; i + kPad < k.dsum.size(); ++i) k.dsum[i] = std::nanf("");
    lt::cuda::attention_backward_cuda(p, nullptr);
    const auto same = [](const Heads& a, const Heads& b) {
      return std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(__nv_bfloat16)) == 0;
    };
    EXPECT_TRUE(same(dqkv1, k.dqkv_buf)) << "dq differs between runs";
    EXPECT_TRUE(same(dk1, k.dk_buf)) << "dk differs between runs";
    EXPECT_TRUE(same(dv1, k.dv_buf)) << "dv differs between runs";
  }
}

// The CUDA-core backward takes the tensor-core forward's lse and out (the cache both paths share).
TEST(AttentionTcSim, CudaCoreBackwardAfterTensorCoreForward) {
  const Shape shapes[] = {{1, 100, 2, 1, 64, Seg::kPacked, false, 8, 1.f}, {1, 77, 4, 1, 128, Seg::kOdd, true, 0, 2.f}};
  for (const Shape& s : shapes) {
    const unsigned seed = seed_for(s, 13);
    print_case("tc fwd + cuda-core bwd", s, seed);
    check_backward(s, seed, AttentionKernel::kCudaCores);
  }
}

// kAuto takes the tensor-core kernels at head_dim 64 and 128 (bit for bit the kTensorCores result,
// and not the CUDA-core one) and the CUDA-core kernels at 32.
TEST(AttentionTcSim, AutoDispatchesByHeadDim) {
  for (int hd : {32, 64, 128}) {
    const Shape s{1, 70, 2, 1, hd, Seg::kPacked, false, 0, 1.f};
    const unsigned seed = seed_for(s, 12);
    print_case("dispatch", s, seed);
    std::vector<std::vector<__nv_bfloat16>> outs;
    for (AttentionKernel kernel : {AttentionKernel::kAuto, AttentionKernel::kTensorCores, AttentionKernel::kCudaCores}) {
      if (hd == 32 && kernel == AttentionKernel::kTensorCores) continue;
      Case k(s);
      k.kernel = kernel;
      make_inputs(k, seed);
      lt::cuda::attention_forward_cuda(k.params(), nullptr);
      outs.push_back(k.out.data);
    }
    const auto same = [](const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& b) {
      return std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    if (hd == 32) {
      EXPECT_TRUE(same(outs[0], outs[1])) << "hd 32: kAuto must be the CUDA-core kernel";
    } else {
      EXPECT_TRUE(same(outs[0], outs[1])) << "hd " << hd << ": kAuto must be the tensor-core kernel";
      EXPECT_FALSE(same(outs[0], outs[2])) << "hd " << hd << ": the two kernels round differently";
    }
  }
}

}  // namespace
