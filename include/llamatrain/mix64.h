// The SplitMix64 finaliser (Steele, Lea, Flood 2014): a 64-bit mix in which consecutive inputs give
// unrelated outputs. Rng (rng.h) steps its state through it, and the stochastic rounding of bf16
// gradient shards hashes with it on the CPU (GradShard, src/optim/grad_shard.cpp) and on the
// device (add_stochastic_bf16_cuda, kernels/optimizer.cu), which must draw the same bits: one
// definition, host and device.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LT_MIX64_HOST_DEVICE __host__ __device__
#else
#define LT_MIX64_HOST_DEVICE
#endif

namespace lt {

LT_MIX64_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace lt
