// kernels/embedding.cu under the CUDA simulator, against the CPU backend
// (lt::cpu::embedding_forward / embedding_backward<float>) on the same bf16-valued inputs.
// The forward pass is a copy and the backward pass adds the rows of every token in index order,
// as the CPU op does, so both must match the CPU bit for bit; padding (row strides > C, and
// elements past the last row) holds a sentinel that must stay untouched.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "embedding.cuh"
#include "kernel_cases.h"
#include "llamatrain/ops_cpu.h"

namespace {

constexpr int kPad = 8;
constexpr float kSentinel = -12288.0f;  // exactly representable in bf16

using Shape = lt::kernelcases::Embedding;

std::vector<int32_t> random_tokens(const Shape& s, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, s.V - 1);
  std::vector<int32_t> t(s.N);
  for (auto& v : t) v = dist(rng);
  t[0] = 0;              // the first id
  t[s.N - 1] = s.V - 1;  // the last id
  if (s.N > 3) t[s.N / 2] = t[1];  // a repeat even when V is large
  return t;
}

uint16_t bits(__nv_bfloat16 h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

TEST(EmbeddingSim, ForwardMatchesCpu) {
  for (const Shape& s : lt::kernelcases::kEmbedding) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    const unsigned seed = s.seed(1);
    std::printf("[embedding fwd] N=%d V=%d C=%d seed=%u\n", s.N, s.V, s.C, seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    const std::vector<int32_t> tokens = random_tokens(s, rng);
    const int64_t ws = s.C + kPad, os = s.C + 3;
    std::vector<__nv_bfloat16> wte(s.V * ws + kPad, __float2bfloat16(kSentinel));
    std::vector<float> wte_f(static_cast<size_t>(s.V) * s.C);
    for (int v = 0; v < s.V; ++v)
      for (int c = 0; c < s.C; ++c) {
        wte[v * ws + c] = __float2bfloat16(dist(rng));
        wte_f[static_cast<size_t>(v) * s.C + c] = __bfloat162float(wte[v * ws + c]);
      }
    std::vector<__nv_bfloat16> out(s.N * os + kPad, __float2bfloat16(kSentinel));
    lt::cuda::EmbeddingForwardParams p;
    p.out = out.data(), p.tokens = tokens.data(), p.wte = wte.data();
    p.N = s.N, p.C = s.C, p.out_row_stride = os, p.wte_row_stride = ws;
    lt::cuda::embedding_forward_cuda(p, nullptr);
    std::vector<float> ref(static_cast<size_t>(s.N) * s.C);
    lt::cpu::embedding_forward(ref.data(), tokens.data(), wte_f.data(), s.N, s.C);
    int bad = 0, touched = 0;
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c) {
        bad += __bfloat162float(out[i * os + c]) != ref[static_cast<size_t>(i) * s.C + c];
        bad += bits(out[i * os + c]) != bits(wte[tokens[i] * ws + c]);
      }
    for (size_t k = 0; k < out.size(); ++k)
      if (static_cast<int64_t>(k) >= s.N * os || k % os >= static_cast<size_t>(s.C))
        touched += __bfloat162float(out[k]) != kSentinel;
    EXPECT_EQ(bad, 0) << "N=" << s.N << " C=" << s.C;
    EXPECT_EQ(touched, 0) << "N=" << s.N << " C=" << s.C;
  }
}

// Runs the backward pass on a dwte pre-filled with `prefill` (+=), returns the padded table.
std::vector<float> run_backward(const Shape& s, const std::vector<int32_t>& tokens, const std::vector<__nv_bfloat16>& dout,
                                int64_t dout_stride, const std::vector<float>& prefill, int64_t dwte_stride) {
  std::vector<float> dwte(s.V * dwte_stride + kPad, kSentinel);
  for (int v = 0; v < s.V; ++v)
    for (int c = 0; c < s.C; ++c) dwte[v * dwte_stride + c] = prefill[static_cast<size_t>(v) * s.C + c];
  const lt::cuda::EmbeddingBackwardPlan plan = lt::cuda::embedding_backward_plan(tokens.data(), s.N, s.V);
  const std::vector<int32_t> device_plan = plan.data;  // "uploaded" copy
  lt::cuda::EmbeddingBackwardParams p;
  p.dwte = dwte.data(), p.dout = dout.data(), p.plan = device_plan.data(), p.n_rows = plan.n_rows;
  p.N = s.N, p.C = s.C, p.dwte_row_stride = dwte_stride, p.dout_row_stride = dout_stride;
  lt::cuda::embedding_backward_cuda(p, nullptr);
  return dwte;
}

TEST(EmbeddingSim, BackwardMatchesCpuBitwiseAndIsDeterministic) {
  for (const Shape& s : lt::kernelcases::kEmbedding) {
    if (s.large) continue;  // the device program's (kernel_cases.h)
    const unsigned seed = s.seed(2);
    std::printf("[embedding bwd] N=%d V=%d C=%d seed=%u\n", s.N, s.V, s.C, seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    const std::vector<int32_t> tokens = random_tokens(s, rng);
    const int64_t ds = s.C + kPad, ws = s.C + 5;
    std::vector<__nv_bfloat16> dout(s.N * ds + kPad, __float2bfloat16(kSentinel));
    std::vector<float> dout_f(static_cast<size_t>(s.N) * s.C), prefill(static_cast<size_t>(s.V) * s.C);
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c) {
        dout[i * ds + c] = __float2bfloat16(dist(rng));
        dout_f[static_cast<size_t>(i) * s.C + c] = __bfloat162float(dout[i * ds + c]);
      }
    for (auto& v : prefill) v = 0.25f * dist(rng);  // += onto an existing gradient

    const std::vector<float> a = run_backward(s, tokens, dout, ds, prefill, ws);
    const std::vector<float> b = run_backward(s, tokens, dout, ds, prefill, ws);
    std::vector<float> ref = prefill;
    lt::cpu::embedding_backward(ref.data(), dout_f.data(), tokens.data(), s.N, s.V, s.C);

    int mismatches = 0, touched = 0;
    double worst = 0.0;
    for (int v = 0; v < s.V; ++v)
      for (int c = 0; c < s.C; ++c) {
        const float g = a[v * ws + c], r = ref[static_cast<size_t>(v) * s.C + c];
        if (std::memcmp(&g, &r, sizeof g) != 0) ++mismatches;
        worst = std::max(worst, static_cast<double>(std::fabs(g - r)));
      }
    for (size_t k = 0; k < a.size(); ++k)
      if (static_cast<int64_t>(k) >= s.V * ws || k % ws >= static_cast<size_t>(s.C)) touched += a[k] != kSentinel;
    std::printf("  vs cpu: %d bit mismatches, worst |err| %.3e\n", mismatches, worst);
    EXPECT_EQ(mismatches, 0) << "N=" << s.N << " V=" << s.V << " C=" << s.C;
    EXPECT_EQ(touched, 0);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "two runs differ";
  }
}

TEST(EmbeddingSim, PlanIsAStableCountingSort) {
  const int32_t tokens[] = {3, 0, 3, 2, 0, 3};
  const lt::cuda::EmbeddingBackwardPlan plan = lt::cuda::embedding_backward_plan(tokens, 6, 5);
  ASSERT_EQ(plan.n_rows, 3);
  const std::vector<int32_t> expect = {0, 2, 3, /*offsets*/ 0, 2, 3, 6, /*positions*/ 1, 4, 3, 0, 2, 5};
  EXPECT_EQ(plan.data, expect);
  const int32_t bad[] = {1, 5};
  EXPECT_THROW(lt::cuda::embedding_backward_plan(bad, 2, 5), std::invalid_argument);
  const int32_t neg[] = {-1};
  EXPECT_THROW(lt::cuda::embedding_backward_plan(neg, 1, 5), std::invalid_argument);
}

}  // namespace
