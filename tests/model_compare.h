// Helpers of the tests that compare a low-precision model pass with the fp32 CPU reference
// (tests/test_cpu_bf16.cpp; the same batches and gradient metric as
// tests/cuda/test_cuda_model_sim.cpp): a packed batch with example boundaries and a loss mask,
// and a per-tensor relative L2 comparison of two gradient vectors that prints every tensor and
// its worst element; and the small model the fp64 gradient checks use.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "llamatrain/config.h"
#include "llamatrain/model.h"

namespace lt::testing {

// The `tiny` preset's structure (GQA, untied head) at a size where finite differences over every
// tensor stay fast (tests/test_model.cpp, tests/test_lora.cpp).
inline Llama2Config finite_difference_config() {
  Llama2Config c = preset_config("tiny");
  c.dim = 16;
  c.hidden_dim = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 19;
  c.max_seq_len = 16;
  return c;
}

// B rows of T tokens, each row holding examples of the given lengths (positions and first visible
// key restart at each), loss on the second half of every example.
struct PackedBatch {
  int B, T;
  std::vector<int32_t> inputs, targets, pos, seg_start;
  std::vector<uint8_t> mask;
  PackedBatch(int b, int t, const std::vector<int>& lengths, int V, uint32_t seed) : B(b), T(t) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> tok(0, V - 1);
    const size_t n = size_t(B) * T;
    inputs.resize(n);
    targets.resize(n);
    pos.resize(n);
    seg_start.resize(n);
    mask.resize(n);
    for (int r = 0; r < B; ++r) {
      int start = 0, li = r;
      while (start < T) {
        const int len = std::min(lengths[size_t(li++) % lengths.size()], T - start);
        for (int i = 0; i < len; ++i) {
          const size_t k = size_t(r) * T + start + i;
          inputs[k] = tok(rng);
          targets[k] = tok(rng);
          pos[k] = i;
          seg_start[k] = start;
          mask[k] = i >= len / 2;
        }
        start += len;
      }
    }
  }
  Batch view() const {
    Batch b;
    b.B = B;
    b.T = T;
    b.inputs = inputs.data();
    b.targets = targets.data();
    b.loss_mask = mask.data();
    b.pos = pos.data();
    b.seg_start = seg_start.data();
    return b;
  }
  int loss_tokens() const { return int(std::count(mask.begin(), mask.end(), 1)); }
};

// Every tensor of `got` within rel_tol of `ref` in relative L2 norm (||got - ref|| / ||ref||),
// printed with its worst element; a zero reference tensor fails (the comparison would prove
// nothing). Returns the worst tensor's relative error.
inline double expect_gradients_near(const TensorTable& layout, const float* got, const float* ref,
                                    double rel_tol, const char* tag) {
  double worst_rel = 0;
  std::string worst_name;
  for (const auto& t : layout.tensors()) {
    double num = 0, den = 0, worst_e = -1;
    size_t worst_k = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      const double g = got[t.offset + i], r = ref[t.offset + i];
      EXPECT_TRUE(std::isfinite(g)) << tag << " d" << t.name << "[" << i << "]";
      num += (g - r) * (g - r);
      den += r * r;
      if (std::fabs(g - r) > worst_e) worst_e = std::fabs(g - r), worst_k = i;
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    std::printf("[%s] d%-34s rel L2 %.3e, worst |err| %.3e at %zu (ref %.4e)\n", tag, t.name.c_str(), rel, worst_e,
                worst_k, double(ref[t.offset + worst_k]));
    EXPECT_GT(den, 0.0) << tag << " " << t.name << ": the reference gradient is zero";
    EXPECT_LT(rel, rel_tol) << tag << " gradient of " << t.name;
    if (rel > worst_rel) worst_rel = rel, worst_name = t.name;
  }
  std::printf("[%s] worst gradient tensor: %s (rel L2 %.3e)\n", tag, worst_name.c_str(), worst_rel);
  return worst_rel;
}

}  // namespace lt::testing
