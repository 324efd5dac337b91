#include "llamatrain/grad_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llamatrain/error.h"
#include "llamatrain/mix64.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/safetensors.h"

namespace lt {

using safetensors::bf16_to_f32;
using safetensors::f32_to_bf16;
namespace {

constexpr size_t kWindow = size_t(1) << 20;  // elements converted at once

}  // namespace

uint16_t bf16_round_stochastic(float x, uint32_t random16) {
  if (!std::isfinite(x)) return f32_to_bf16(x);
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  // Adding a uniform 16-bit value to the dropped bits carries into the kept ones with probability
  // (dropped bits) / 2^16: the magnitude rounds up that often, down otherwise (the sign bit is
  // apart, so this is symmetric about zero). Rounding up from the largest finite bf16 gives
  // infinity, as a sum that large would in fp32 soon after.
  u += random16 & 0xffffu;
  return uint16_t(u >> 16);
}

void GradShard::assign(size_t n, DType dtype) {
  LT_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "gradient shard dtype ", dtype_name(dtype));
  dtype_ = dtype;
  n_ = n;
  f32_.clear();
  bf16_.clear();
  if (dtype == DType::kF32) f32_.assign(n, 0.f);
  else bf16_.assign(n, 0);
}

void GradShard::zero() {
  std::fill(f32_.begin(), f32_.end(), 0.f);
  std::fill(bf16_.begin(), bf16_.end(), uint16_t(0));
}

void GradShard::add(size_t at, const float* x, size_t n) {
  LT_CHECK(at + n <= n_, "GradShard::add [", at, ", ", at + n, ") of ", n_);
  if (dtype_ == DType::kF32) {
    for (size_t i = 0; i < n; ++i) f32_[at + i] += x[i];
    return;
  }
  const uint64_t seed = mix64(++adds_);
  for (size_t i = 0; i < n; ++i) {
    const float sum = bf16_to_f32(bf16_[at + i]) + x[i];
    bf16_[at + i] = bf16_round_stochastic(sum, uint32_t(mix64(seed ^ (at + i))));
  }
}

void GradShard::add_bf16(size_t at, const uint16_t* x, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_f32(x[i]);
  add(at, f.data(), n);
}

double GradShard::sum_squares(size_t at, size_t n) const {
  LT_CHECK(at + n <= n_, "GradShard::sum_squares [", at, ", ", at + n, ") of ", n_);
  if (dtype_ == DType::kF32) return cpu::sum_squares(f32_.data() + at, n);
  double s = 0;
  std::vector<float> buf(std::min(n, kWindow));
  for (size_t w = 0; w < n; w += kWindow) {
    const size_t m = std::min(kWindow, n - w);
    read(at + w, m, buf.data());
    s += cpu::sum_squares(buf.data(), m);
  }
  return s;
}

void GradShard::scale(float s) {
  if (dtype_ == DType::kF32) return cpu::scale_inplace(f32_.data(), s, n_);
  for (uint16_t& v : bf16_) v = f32_to_bf16(bf16_to_f32(v) * s);
}

void GradShard::read(size_t at, size_t n, float* out) const {
  LT_CHECK(at + n <= n_, "GradShard::read [", at, ", ", at + n, ") of ", n_);
  if (dtype_ == DType::kF32) std::memcpy(out, f32_.data() + at, n * sizeof(float));
  else
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(bf16_[at + i]);
}

std::vector<float> GradShard::to_f32() const {
  std::vector<float> out(n_);
  read(0, n_, out.data());
  return out;
}

}  // namespace lt
