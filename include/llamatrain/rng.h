// Deterministic random numbers whose sequence is fixed by this file (not by the standard
// library's distribution implementations), so seeds replay on every platform.
#pragma once
#include <cmath>
#include <cstdint>

#include "llamatrain/mix64.h"

namespace lt {

// splitmix64 (Steele, Lea, Flood 2014): a full-period 64-bit generator.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (Lemire's multiply-shift; bias < n / 2^64, negligible here).
  uint64_t below(uint64_t n) { return uint64_t((__uint128_t(next_u64()) * n) >> 64); }
  // Standard normal by Box-Muller (one value per call; the second is discarded for simplicity).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

// Fisher-Yates shuffle with Rng, so permutations depend only on the seed.
template <class Vec>
void shuffle(Vec& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = size_t(rng.below(i));
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace lt
