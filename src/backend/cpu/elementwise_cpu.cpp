// Element-wise ops on the CPU: SwiGLU forward/backward, the residual add, and LoRA's scale and
// dropout.
#include <cmath>
#include <cstddef>

#include "llamatrain/mix64.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// sigmoid(x) = 1 / (1 + exp(-x)); exp overflows to inf for x << 0, giving the correct limit 0.
template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

// out = silu(h1) * h3, silu(x) = x sigmoid(x).
template <class T>
void swiglu_forward(T* out /*(N,F)*/, const T* h1 /*(N,F)*/, const T* h3 /*(N,F)*/, int N, int F) {
  const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(N) * F;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const T a = h1[i];
    out[i] = a * sigmoid(a) * h3[i];
  }
}

// silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))), so
//   dh1 = dout h3 silu'(h1), dh3 = dout silu(h1).
// Every element is read into locals before it is written, so dh1/dh3 may alias the inputs.
template <class T>
void swiglu_backward(T* dh1 /*(N,F) =*/, T* dh3 /*(N,F) =*/, const T* dout /*(N,F)*/,
                     const T* h1, const T* h3, int N, int F) {
  const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(N) * F;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const T a = h1[i], b = h3[i], g = dout[i];
    const T s = sigmoid(a);
    dh1[i] = g * b * s * (T(1) + a * (T(1) - s));
    dh3[i] = g * a * s;
  }
}

template <class T>
void residual_add(T* out, const T* a, const T* b, size_t n) {
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) out[i] = a[i] + b[i];
}

template <class T>
void scale(T* x, float s, size_t n) {
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) x[i] *= T(s);
}

template <class T>
void dropout(T* out, const T* x, size_t n, float p, uint64_t stream) {
  const std::ptrdiff_t len = static_cast<std::ptrdiff_t>(n);
  const T keep_scale = T(1) / (T(1) - T(p));
  const uint64_t base = mix64(stream);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < len; ++i) {
    const double u = double(mix64(base + uint64_t(i)) >> 11) * 0x1.0p-53;
    out[i] = u < p ? T(0) : x[i] * keep_scale;
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, int, int);
template void swiglu_forward<double>(double*, const double*, const double*, int, int);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, int,
                                     int);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int, int);
template void residual_add<float>(float*, const float*, const float*, size_t);
template void residual_add<double>(double*, const double*, const double*, size_t);
template void scale<float>(float*, float, size_t);
template void scale<double>(double*, float, size_t);
template void dropout<float>(float*, const float*, size_t, float, uint64_t);
template void dropout<double>(double*, const double*, size_t, float, uint64_t);

}  // namespace lt::cpu
