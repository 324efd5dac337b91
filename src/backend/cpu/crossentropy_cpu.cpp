// Fused softmax + cross-entropy with a loss mask on the CPU.
//
// lse_i = m_i + log sum_j exp(l_ij - m_i), m_i = max_j l_ij (the max subtraction keeps exp from
// overflowing); loss_i = mask_i (lse_i - l_i,t_i), the mask a token's weight (0: not counted);
// d loss_i / d l_ij = mask_i (softmax_ij - [j == t_i]).
#include <cmath>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// Masked-out rows may carry any target (padding); masked-in ones must index the vocabulary.
void check_targets(const int32_t* targets, const uint8_t* mask, int N, int V) {
  LT_CHECK(N <= 0 || V > 0, "crossentropy: empty vocabulary");
  for (int i = 0; i < N; ++i)
    if (!mask || mask[i])
      LT_CHECK(targets[i] >= 0 && targets[i] < V, "crossentropy: target ", targets[i], " at row ",
               i, " outside the vocabulary [0, ", V, ")");
}

}  // namespace

// A null mask counts every row. The per-row losses are kept in double and summed in row order
// after the parallel loop, so the returned sum does not depend on the thread count.
template <class T>
double crossentropy_forward(T* losses /*(N)*/, T* lse /*(N)*/, const T* logits /*(N,V)*/,
                            const int32_t* targets /*(N)*/, const uint8_t* mask /*(N)*/, int N,
                            int V) {
  check_targets(targets, mask, N, V);
  std::vector<double> row_loss(N > 0 ? N : 0);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* li = logits + static_cast<size_t>(i) * V;
    T m = li[0];
    for (int j = 1; j < V; ++j) m = li[j] > m ? li[j] : m;
    double sum = 0.0;
    for (int j = 0; j < V; ++j) sum += std::exp(li[j] - m);  // exp in T, sum in double
    const double row_lse = static_cast<double>(m) + std::log(sum);
    lse[i] = static_cast<T>(row_lse);
    row_loss[i] = (!mask || mask[i]) ? (row_lse - li[targets[i]]) * (mask ? mask[i] : 1) : 0.0;  // its weight
    losses[i] = static_cast<T>(row_loss[i]);
  }
  double total = 0.0;
  for (int i = 0; i < N; ++i) total += row_loss[i];
  return total;
}

// dlogits_ij = mask_i dloss (exp(l_ij - lse_i) - [j == t_i]). Each element is read before it is
// written and nothing else of the row is needed afterwards, so dlogits may alias logits.
template <class T>
void crossentropy_backward(T* dlogits /*(N,V) =*/, const T* logits /*(N,V)*/, const T* lse /*(N)*/,
                           const int32_t* targets, const uint8_t* mask, float dloss, int N, int V) {
  check_targets(targets, mask, N, V);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* li = logits + static_cast<size_t>(i) * V;
    T* di = dlogits + static_cast<size_t>(i) * V;
    if (mask && !mask[i]) {
      for (int j = 0; j < V; ++j) di[j] = T(0);
      continue;
    }
    const T g = static_cast<T>(dloss) * T(mask ? mask[i] : 1);  // the token's weight
    const T row_lse = lse[i];
    const int t = targets[i];
    for (int j = 0; j < V; ++j) {
      const T p = std::exp(li[j] - row_lse);
      di[j] = g * (j == t ? p - T(1) : p);
    }
  }
}

template double crossentropy_forward<float>(float*, float*, const float*, const int32_t*,
                                            const uint8_t*, int, int);
template double crossentropy_forward<double>(double*, double*, const double*, const int32_t*,
                                             const uint8_t*, int, int);
template void crossentropy_backward<float>(float*, const float*, const float*, const int32_t*,
                                           const uint8_t*, float, int, int);
template void crossentropy_backward<double>(double*, const double*, const double*, const int32_t*,
                                            const uint8_t*, float, int, int);

}  // namespace lt::cpu
