// The fused bf16-writing ops (ops_bf16.h); the formulas are those of rmsnorm_cpu.cpp,
// elementwise_cpu.cpp and crossentropy_cpu.cpp.
#include "backend/cpu/onednn/ops_bf16.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "llamatrain/error.h"

namespace lt::cpu {

void rmsnorm_forward_bf16(float* out, bf16* out_bf16, float* rstd, const float* x, const float* w, int N, int C,
                          float eps) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* xi = x + size_t(i) * C;
    float* oi = out + size_t(i) * C;
    bf16* bi = out_bf16 + size_t(i) * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += double(xi[c]) * xi[c];
    const float r = float(1.0 / std::sqrt(ss / C + double(eps)));
    rstd[i] = r;
    for (int c = 0; c < C; ++c) {
      oi[c] = xi[c] * r * w[c];
      bi[c] = float_to_bf16(oi[c]);
    }
  }
}

void swiglu_forward_bf16(float* out, bf16* out_bf16, const float* h1, const float* h3, int N, int F) {
  const std::ptrdiff_t n = std::ptrdiff_t(N) * F;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const float a = h1[i];
    out[i] = a / (1.0f + std::exp(-a)) * h3[i];
    out_bf16[i] = float_to_bf16(out[i]);
  }
}

void swiglu_backward_bf16(bf16* dh1, bf16* dh3, const float* dout, const float* h1, const float* h3, int N,
                          int F) {
  const std::ptrdiff_t n = std::ptrdiff_t(N) * F;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const float a = h1[i], b = h3[i], g = dout[i];
    const float s = 1.0f / (1.0f + std::exp(-a));
    dh1[i] = float_to_bf16(g * b * s * (1.0f + a * (1.0f - s)));
    dh3[i] = float_to_bf16(g * a * s);
  }
}

double crossentropy_forward_bf16(float* losses, float* lse, bf16* e, float* row_max, const float* logits,
                                 const int32_t* targets, const uint8_t* mask, int N, int V) {
  LT_CHECK(N <= 0 || V > 0, "crossentropy: empty vocabulary");
  for (int i = 0; i < N; ++i)
    if ((!mask || mask[i]) && (targets[i] < 0 || targets[i] >= V))
      fail(strcat("crossentropy: target id ", targets[i], " at row ", i, " is outside [0, ", V, ")"));
  std::vector<double> row_loss(size_t(N > 0 ? N : 0));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* li = logits + size_t(i) * V;
    bf16* ei = e + size_t(i) * V;
    float m = li[0];
    for (int j = 1; j < V; ++j) m = li[j] > m ? li[j] : m;
    double sum = 0.0;
    for (int j = 0; j < V; ++j) {
      const float x = std::exp(li[j] - m);
      sum += x;
      ei[j] = float_to_bf16(x);
    }
    const double row_lse = double(m) + std::log(sum);
    row_max[i] = m;
    lse[i] = float(row_lse);
    row_loss[size_t(i)] = (!mask || mask[i]) ? row_lse - li[targets[i]] : 0.0;
    losses[i] = float(row_loss[size_t(i)]);
  }
  double total = 0.0;
  for (int i = 0; i < N; ++i) total += row_loss[size_t(i)];
  return total;
}

void crossentropy_backward_from_exp_bf16(bf16* dlogits_e, const float* logits, const float* lse,
                                         const float* row_max, const int32_t* targets, const uint8_t* mask,
                                         float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    bf16* di = dlogits_e + size_t(i) * V;
    if (mask && !mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = 0;
      continue;
    }
    const float scale = dloss * std::exp(row_max[i] - lse[i]);  // dloss / sum_j exp(l_ij - max)
    for (int j = 0; j < V; ++j) di[j] = float_to_bf16(bf16_to_float(di[j]) * scale);
    const int t = targets[i];
    di[t] = float_to_bf16(dloss * (std::exp(logits[size_t(i) * V + t] - lse[i]) - 1.0f));
  }
}

void crossentropy_backward_bf16(bf16* dlogits, const float* logits, const float* lse, const int32_t* targets,
                                const uint8_t* mask, float dloss, int N, int V) {
  for (int i = 0; i < N; ++i)
    if ((!mask || mask[i]) && (targets[i] < 0 || targets[i] >= V))
      fail(strcat("crossentropy: target id ", targets[i], " at row ", i, " is outside [0, ", V, ")"));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* li = logits + size_t(i) * V;
    bf16* di = dlogits + size_t(i) * V;
    if (mask && !mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = 0;
      continue;
    }
    const float row_lse = lse[i];
    const int t = targets[i];
    for (int j = 0; j < V; ++j) {
      const float p = std::exp(li[j] - row_lse);
      di[j] = float_to_bf16(dloss * (j == t ? p - 1.0f : p));
    }
  }
}

}  // namespace lt::cpu
