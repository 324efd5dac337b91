// Fused softmax + cross-entropy over the vocabulary on the device, with a loss mask: the twin of
// lt::cpu::crossentropy_forward / crossentropy_backward in include/llamatrain/ops_cpu.h.
// Logits bf16 (N, V) with an explicit row stride (elements); targets int32; mask uint8, each row's
// weight in the loss (0: not counted; null = every row counts once); the per-row losses, the lse
// cache and the arithmetic are fp32. The
// probabilities are never stored: forward keeps a running (max, sum) per thread (online softmax,
// one pass over the row) and backward recomputes exp(logit - lse) from the lse cache.
// Logits must be finite (a NaN propagates into its row's loss/lse).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

struct CrossentropyForwardParams {
  float* losses = nullptr;               // (N) mask[i] * (lse[i] - logits[i, t_i]) (0 where mask[i] is 0)
  float* lse = nullptr;                  // (N) log sum_j exp(logits[i, j]), every row (masked too)
  double* loss_sum = nullptr;            // optional (1): sum_i losses[i] in double, fixed order
  const __nv_bfloat16* logits = nullptr; // (N, V) row stride logits_row_stride
  const int32_t* targets = nullptr;      // (N) read only where the mask is set
  const uint8_t* mask = nullptr;         // (N) or null (every row counts)
  int N = 0, V = 0;
  int64_t logits_row_stride = 0;
};

// One block per row. A masked-in target outside [0, V) gives a NaN loss (the CPU op throws; a
// kernel cannot). When loss_sum is set, a second one-block launch sums the fp32 per-row losses
// in double in a fixed order (strided per-thread sums, then a fixed shuffle tree): the same bits
// on every run, no atomics.
void crossentropy_forward_cuda(const CrossentropyForwardParams& p, cudaStream_t stream);

struct CrossentropyBackwardParams {
  __nv_bfloat16* dlogits = nullptr;      // (N, V) =, row stride dlogits_row_stride; may be logits
  const __nv_bfloat16* logits = nullptr; // (N, V) row stride logits_row_stride
  const float* lse = nullptr;            // (N) from the forward pass
  const int32_t* targets = nullptr;      // (N) read only where the mask is set
  const uint8_t* mask = nullptr;         // (N) or null
  float dloss = 0.f;                     // d(objective) / d(loss of one token), e.g. 1 / count
  int N = 0, V = 0;
  int64_t dlogits_row_stride = 0, logits_row_stride = 0;
};

// dlogits[i, j] = mask[i] * (exp(logits[i, j] - lse[i]) - [j == t_i]) * dloss. Every element
// is read and written by the same thread, so dlogits may alias logits (in place) when the two
// row strides are equal.
void crossentropy_backward_cuda(const CrossentropyBackwardParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
