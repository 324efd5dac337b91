// Token embedding forward/backward on the device, the twins of lt::cpu::embedding_forward /
// embedding_backward in include/llamatrain/ops_cpu.h (src/backend/cpu/embedding_cpu.cpp).
//   forward:  out[i, :] = wte[tokens[i], :]              (bf16 gather, exact)
//   backward: dwte[tokens[i], :] += dout[i, :]           (fp32 table, bf16 dout, +=)
// Determinism of the backward pass (no float atomics): a counting sort of the token ids on the
// host (embedding_backward_plan, O(N + V), stable) lists every distinct token once with the rows
// that use it in increasing index order. The caller copies the plan to the device (it is a pure
// function of the host-side tokens, which the data loader has anyway); the kernel then gives one
// block per (distinct token, column chunk), and each thread owns one dwte element and adds that
// token's rows to it in index order: exactly the CPU op's order, so the result is bitwise the
// CPU's (on the same bf16-valued dout) and identical on every run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

struct EmbeddingForwardParams {
  __nv_bfloat16* out = nullptr;        // (N, C) row stride out_row_stride
  const int32_t* tokens = nullptr;     // (N) ids in [0, V)
  const __nv_bfloat16* wte = nullptr;  // (V, C) row stride wte_row_stride
  int N = 0, C = 0;
  int64_t out_row_stride = 0, wte_row_stride = 0;
};

void embedding_forward_cuda(const EmbeddingForwardParams& p, cudaStream_t stream);

// The host-built schedule of the backward pass, one int32 buffer laid out as
//   rows[n_rows] | offsets[n_rows + 1] | positions[N]
// rows: the distinct token ids in increasing order; positions[offsets[r] .. offsets[r+1]) the
// indices i with tokens[i] == rows[r], increasing.
struct EmbeddingBackwardPlan {
  std::vector<int32_t> data;
  int n_rows = 0, N = 0;
  size_t rows_offset() const { return 0; }
  size_t offsets_offset() const { return static_cast<size_t>(n_rows); }
  size_t positions_offset() const { return 2 * static_cast<size_t>(n_rows) + 1; }
};

// Host: counting sort of tokens (host memory); throws std::invalid_argument on an id outside [0, V).
EmbeddingBackwardPlan embedding_backward_plan(const int32_t* tokens, int N, int V);

struct EmbeddingBackwardParams {
  float* dwte = nullptr;                // (V, C) +=, row stride dwte_row_stride
  const __nv_bfloat16* dout = nullptr;  // (N, C) row stride dout_row_stride
  const int32_t* plan = nullptr;        // device copy of EmbeddingBackwardPlan::data
  int n_rows = 0;                       // EmbeddingBackwardPlan::n_rows
  int N = 0, C = 0;
  int64_t dwte_row_stride = 0, dout_row_stride = 0;
};

void embedding_backward_cuda(const EmbeddingBackwardParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
