// Token embedding forward/backward on the CPU.
#include <algorithm>
#include <cstring>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {
namespace {

// Columns per backward task: wide enough for contiguous row slices, narrow enough that even a
// small C spreads over a few threads.
constexpr int kEmbeddingColumnBlock = 64;

void check_tokens(const int32_t* tokens, int N, int V) {
  for (int i = 0; i < N; ++i)
    LT_CHECK(tokens[i] >= 0 && tokens[i] < V, "embedding: token ", tokens[i], " at row ", i,
             " outside the vocabulary [0, ", V, ")");
}

}  // namespace

template <class T>
void embedding_forward(T* out /*(N,C)*/, const int32_t* tokens /*(N)*/, const T* wte /*(V,C)*/,
                       int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i)
    std::memcpy(out + static_cast<size_t>(i) * C, wte + static_cast<size_t>(tokens[i]) * C,
                sizeof(T) * C);
}

// Parallel over column blocks, every thread walking all rows in index order: each dwte element is
// owned by one thread and receives its rows in index order, so the result is bitwise the same for
// any thread count (a scatter over rows would race on repeated tokens).
template <class T>
void embedding_backward(T* dwte /*(V,C) +=*/, const T* dout /*(N,C)*/, const int32_t* tokens,
                        int N, int V, int C) {
  check_tokens(tokens, N, V);
  const int n_blocks = (C + kEmbeddingColumnBlock - 1) / kEmbeddingColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int c0 = blk * kEmbeddingColumnBlock;
    const int c1 = std::min(C, c0 + kEmbeddingColumnBlock);
    for (int i = 0; i < N; ++i) {
      const T* src = dout + static_cast<size_t>(i) * C;
      T* dst = dwte + static_cast<size_t>(tokens[i]) * C;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int, int);
template void embedding_forward<double>(double*, const int32_t*, const double*, int, int);
template void embedding_backward<float>(float*, const float*, const int32_t*, int, int, int);
template void embedding_backward<double>(double*, const double*, const int32_t*, int, int, int);

}  // namespace lt::cpu
