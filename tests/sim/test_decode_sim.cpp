// The kernels of decoding and LoRA under the CUDA simulator (race-checked, in three thread orders,
// and under ASan): kernels/attention_decode.cu against lt::cpu::attention_decode and fp64 (the
// low-precision rule of STYLE.md: the kernel's worst error against fp64 at most 2x the naive bf16
// computation's), and kernels/elementwise.cu's dropout against lt::cpu::dropout (the same elements
// dropped, the kept ones the CPU's value rounded once: bitwise). The GPU runs the same checks
// (tests/gpu/kernel_checks.cu) on larger shapes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention_decode.cuh"
#include "elementwise.cuh"
#include "kernel_cases.h"
#include "llamatrain/ops_cpu.h"
#include "sim_test_util.h"

namespace {

using lt::simtest::bf;
using lt::simtest::Bf16Matrix;
using lt::simtest::random_bf16;
using lt::simtest::describe;
using lt::simtest::ErrorReport;

TEST(AttentionDecodeSim, MatchesCpuAndFp64) {
  for (const lt::kernelcases::Decode& s : lt::kernelcases::kDecode) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    const unsigned seed = s.seed();
    std::printf("[attention decode] n=%d H=%d KVH=%d hd=%d seed=%u\n", s.n, s.H, s.KVH, s.hd, seed);
    std::mt19937 rng(seed);
    const Bf16Matrix q = random_bf16(1, s.H * s.hd, rng, 0.7f), k = random_bf16(s.n, s.KVH * s.hd, rng, 0.7f),
                     v = random_bf16(s.n, s.KVH * s.hd, rng, 1.f);
    Bf16Matrix out(1, s.H * s.hd);
    lt::cuda::AttentionDecodeParams p;
    p.out = out.data.data(), p.q = q.data.data(), p.k = k.data.data(), p.v = v.data.data();
    p.kv_stride = k.stride;  // padded rows
    p.n = s.n, p.H = s.H, p.KVH = s.KVH, p.hd = s.hd;
    lt::cuda::attention_decode_cuda(p, nullptr);
    const auto q32 = q.dense<float>(), k32 = k.dense<float>(), v32 = v.dense<float>();
    const auto q64 = q.dense<double>(), k64 = k.dense<double>(), v64 = v.dense<double>();
    std::vector<float> r32(q32.size());
    std::vector<double> r64(q64.size());
    const int64_t dense = int64_t(s.KVH) * s.hd;
    lt::cpu::attention_decode(r32.data(), q32.data(), k32.data(), v32.data(), dense, s.n, s.H, s.KVH, s.hd);
    lt::cpu::attention_decode(r64.data(), q64.data(), k64.data(), v64.data(), dense, s.n, s.H, s.KVH, s.hd);
    ErrorReport kernel_err, naive_err;
    for (int c = 0; c < s.H * s.hd; ++c) {
      kernel_err.add(0, c, out.get(0, c), r64[size_t(c)]);
      naive_err.add(0, c, bf(r32[size_t(c)]), r64[size_t(c)]);
    }
    std::printf("  %s\n  %s\n", describe("kernel vs fp64", kernel_err).c_str(),
                describe("naive bf16 vs fp64", naive_err).c_str());
    EXPECT_TRUE(kernel_err.finite);
    EXPECT_LE(kernel_err.worst, 2.0 * naive_err.worst) << "seed=" << seed;
    EXPECT_EQ(out.touched_padding(), 0) << "seed=" << seed;
  }
}

TEST(AttentionDecodeSim, RefusesShapesItDoesNotTake) {
  std::vector<__nv_bfloat16> buf(64);
  lt::cuda::AttentionDecodeParams p;
  p.out = nullptr, p.q = p.k = p.v = nullptr;
  p.n = 1, p.H = 2, p.KVH = 1, p.hd = 16, p.kv_stride = 16;
  EXPECT_THROW(lt::cuda::attention_decode_cuda(p, nullptr), std::invalid_argument);  // null pointers
  p.out = buf.data(), p.q = p.k = p.v = buf.data();
  p.H = 3, p.KVH = 2;
  EXPECT_THROW(lt::cuda::attention_decode_cuda(p, nullptr), std::invalid_argument);  // H not a multiple of KVH
  p.H = 2, p.KVH = 1, p.n = lt::cuda::kAttentionDecodeMaxPositions + 1;
  EXPECT_THROW(lt::cuda::attention_decode_cuda(p, nullptr), std::invalid_argument);
  p.n = 1, p.kv_stride = 8;
  EXPECT_THROW(lt::cuda::attention_decode_cuda(p, nullptr), std::invalid_argument);  // stride below KVH * hd
}

TEST(DropoutSim, DropsTheCpusElementsInPlaceOrNot) {
  for (const lt::kernelcases::Dropout& c : lt::kernelcases::kDropout) {
    const size_t n = c.n;
    const unsigned seed = c.seed();
    const uint64_t stream = c.stream();
    std::printf("[dropout] n=%zu p=%.2f stream=%llu seed=%u\n", n, double(c.p), (unsigned long long)stream, seed);
    std::mt19937 rng(seed);
    const Bf16Matrix x = random_bf16(1, int(n), rng, 1.f);
    Bf16Matrix out(1, int(n)), in_place = x;
    lt::cuda::dropout_cuda(out.data.data(), x.data.data(), n, c.p, stream, nullptr);
    lt::cuda::dropout_cuda(in_place.data.data(), in_place.data.data(), n, c.p, stream, nullptr);
    const std::vector<float> x32 = x.dense<float>();
    std::vector<float> ref(n);
    lt::cpu::dropout(ref.data(), x32.data(), n, c.p, stream);
    size_t bad = 0, dropped = 0;
    for (size_t i = 0; i < n; ++i) {
      bad += out.get(0, int(i)) != bf(ref[i]) || in_place.get(0, int(i)) != bf(ref[i]);
      dropped += ref[i] == 0.f && x32[i] != 0.f;
    }
    const double share = double(dropped) / double(n);
    std::printf("  %zu of %zu dropped (%.4f, p %.2f)\n", dropped, n, share, double(c.p));
    EXPECT_EQ(bad, 0u) << "seed=" << seed;
    EXPECT_EQ(out.touched_padding(), 0);
    if (lt::kernelcases::dropout_share_checked(n)) {
      EXPECT_NEAR(share, c.p, lt::kernelcases::dropout_share_tolerance(c)) << "seed=" << seed;
    }
  }
}

}  // namespace
