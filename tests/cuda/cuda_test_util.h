// Helpers shared by the cuda-sim backend's test files.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "cuda_compat.cuh"

namespace lt::cudatest {

// n bf16 values drawn from N(0, 1) by rng.
inline std::vector<__nv_bfloat16> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(d(rng));
  return v;
}

}  // namespace lt::cudatest
