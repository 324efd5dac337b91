// bf16 storage on the CPU backend: the 16 high bits of an IEEE fp32 (1 sign, 8 exponent, 7
// mantissa bits), rounded to nearest even as PyTorch and oneDNN round, NaN kept quiet.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace lt::cpu {

using bf16 = uint16_t;

// Branch-free (a select), so the loops that convert vectorise.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  const uint32_t quiet_nan = (u >> 16) | 0x40u;                     // NaN stays NaN
  return bf16((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float bf16_to_float(bf16 h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// dst[i] = bf16(src[i]), parallel over threads (OpenMP).
void convert_to_bf16(bf16* dst, const float* src, size_t n);

}  // namespace lt::cpu
