// Helpers shared by the kernel tests that run on the CUDA simulator: padded bf16 matrices whose
// padding holds a sentinel (a kernel that writes outside its rows is caught), and the worst-element
// report every comparison prints.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace lt::simtest {

constexpr int kPad = 8;                 // extra elements per row, and after the last row, that must stay untouched
constexpr float kSentinel = -12288.0f;  // -3 * 2^12: exactly representable in bf16

// v rounded to bf16 and back.
inline float bf(float v) { return __bfloat162float(__float2bfloat16(v)); }

// A padded (N, C) bf16 matrix with row stride C + kPad, padding filled with the sentinel.
struct Bf16Matrix {
  int N, C;
  int64_t stride;
  std::vector<__nv_bfloat16> data;
  Bf16Matrix(int n, int c) : N(n), C(c), stride(c + kPad), data(n * (c + kPad) + kPad, __float2bfloat16(kSentinel)) {}
  __nv_bfloat16& at(int i, int c) { return data[i * stride + c]; }
  float get(int i, int c) const { return __bfloat162float(data[i * stride + c]); }
  // Number of padding elements that no longer hold the sentinel.
  int touched_padding() const {
    int bad = 0;
    for (size_t k = 0; k < data.size(); ++k) {
      const bool pad = static_cast<int64_t>(k) >= N * stride || (k % stride) >= static_cast<size_t>(C);
      if (pad && __bfloat162float(data[k]) != kSentinel) ++bad;
    }
    return bad;
  }
  // The values without padding, row-major (N, C).
  template <class T>
  std::vector<T> dense() const {
    std::vector<T> v(static_cast<size_t>(N) * C);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) v[static_cast<size_t>(i) * C + c] = get(i, c);
    return v;
  }
};

// An (N, C) matrix of N(0, scale^2) draws rounded to bf16.
inline Bf16Matrix random_bf16(int N, int C, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  Bf16Matrix m(N, C);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) m.at(i, c) = __float2bfloat16(dist(rng));
  return m;
}

// Worst |got - ref| with its position, and whether every value was finite.
struct ErrorReport {
  double worst = 0.0;
  int row = -1, col = -1;
  double got = 0.0, ref = 0.0;
  bool finite = true;
  void add(int i, int c, double g, double r) {
    if (!std::isfinite(g)) finite = false;
    const double e = std::fabs(g - r);
    if (e > worst || row < 0) worst = e, row = i, col = c, got = g, ref = r;
  }
};

inline std::string describe(const char* what, const ErrorReport& e) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s worst |err| %.3e at (%d,%d): got %.8g ref %.8g", what, e.worst, e.row, e.col,
                e.got, e.ref);
  return buf;
}

}  // namespace lt::simtest
