// Rotary position embedding (RoPE) forward/backward on the CPU, Meta layout.
//
// Pair (x[2i], x[2i+1]) of every head is rotated by angle = p * theta^(-2i/hd) (Meta's
// precompute_freqs_cis and llama2.c), p = pos[b,t] or t:
//   out[2i]   = x[2i] cos - x[2i+1] sin
//   out[2i+1] = x[2i] sin + x[2i+1] cos
// The backward pass applies the transposed rotation (angle -> -angle). Angles, cos and sin are
// computed in double and only then rounded to T, so the float and double versions see the same
// rotation up to fp32 rounding even at large positions.
#include <cmath>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// Rotates every head of one token row by the angles of position p; sign = +1 forward, -1 backward.
// Each pair is read into locals before it is written, so out may alias x.
template <class T>
void rope_row(T* out /*(H,hd)*/, const T* x /*(H,hd)*/, double p, int H, int hd, double sign,
              const std::vector<double>& freq /*(hd/2)*/, std::vector<T>& cos_sin /*(hd/2, 2)*/) {
  const int half = hd / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = p * freq[i];
    cos_sin[2 * i] = static_cast<T>(std::cos(angle));
    cos_sin[2 * i + 1] = static_cast<T>(sign * std::sin(angle));
  }
  for (int h = 0; h < H; ++h) {
    const T* xh = x + static_cast<size_t>(h) * hd;
    T* oh = out + static_cast<size_t>(h) * hd;
    for (int i = 0; i < half; ++i) {
      const T c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const T x0 = xh[2 * i], x1 = xh[2 * i + 1];
      oh[2 * i] = x0 * c - x1 * s;
      oh[2 * i + 1] = x0 * s + x1 * c;
    }
  }
}

template <class T>
void rope_apply(T* out, const T* x, const int32_t* pos, int B, int Tn, int H, int hd, float theta,
                double sign) {
  LT_CHECK(hd % 2 == 0, "rope: head_dim ", hd, " must be even");
  const int rows = B * Tn;
  std::vector<double> freq(hd / 2);  // theta^(-2i/hd)
  for (int i = 0; i < hd / 2; ++i) freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / hd);
#pragma omp parallel
  {
    std::vector<T> cos_sin(hd);
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const double p = pos ? pos[r] : r % Tn;
      const size_t off = static_cast<size_t>(r) * H * hd;
      rope_row(out + off, x + off, p, H, hd, sign, freq, cos_sin);
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* out /*(B,T,H,hd)*/, const T* x /*(B,T,H,hd)*/, const int32_t* pos /*(B,T)*/,
                  int B, int Tn, int H, int hd, float theta) {
  rope_apply(out, x, pos, B, Tn, H, hd, theta, 1.0);
}

template <class T>
void rope_backward(T* dx /*(B,T,H,hd) =*/, const T* dout /*(B,T,H,hd)*/, const int32_t* pos,
                   int B, int Tn, int H, int hd, float theta) {
  rope_apply(dx, dout, pos, B, Tn, H, hd, theta, -1.0);
}

template void rope_forward<float>(float*, const float*, const int32_t*, int, int, int, int, float);
template void rope_forward<double>(double*, const double*, const int32_t*, int, int, int, int,
                                   float);
template void rope_backward<float>(float*, const float*, const int32_t*, int, int, int, int, float);
template void rope_backward<double>(double*, const double*, const int32_t*, int, int, int, int,
                                    float);

}  // namespace lt::cpu
