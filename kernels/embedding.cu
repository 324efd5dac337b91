// Embedding kernels: a row gather (grid: rows x column chunks) and a per-distinct-token fixed-order
// sum for the backward pass (see embedding.cuh). Semantics: src/backend/cpu/embedding_cpu.cpp.
#include "embedding.cuh"

#include <stdexcept>
#include <string>

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct EmbeddingTraits {
  static constexpr int kThreads = 128;        // columns per block step
  static constexpr unsigned kMaxChunks = 64;  // column chunks per row (grid y); larger C loops
};

__global__ void __launch_bounds__(EmbeddingTraits::kThreads) embedding_forward_kernel(EmbeddingForwardParams p) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* src = p.wte + static_cast<int64_t>(p.tokens[row]) * p.wte_row_stride;
  __nv_bfloat16* dst = p.out + row * p.out_row_stride;
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < p.C; c += gridDim.y * blockDim.x) dst[c] = src[c];
}

// Block (r, chunk): distinct token rows[r]; each thread owns dwte[rows[r], c] and adds the rows of
// dout that use the token in increasing index order.
__global__ void __launch_bounds__(EmbeddingTraits::kThreads) embedding_backward_kernel(EmbeddingBackwardParams p) {
  const int r = blockIdx.x;
  const int32_t* rows = p.plan;
  const int32_t* offsets = p.plan + p.n_rows;
  const int32_t* positions = p.plan + 2 * p.n_rows + 1;
  const int k0 = offsets[r], k1 = offsets[r + 1];
  float* dst = p.dwte + static_cast<int64_t>(rows[r]) * p.dwte_row_stride;
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < p.C; c += gridDim.y * blockDim.x) {
    float acc = dst[c];
    for (int k = k0; k < k1; ++k) acc += __bfloat162float(p.dout[static_cast<int64_t>(positions[k]) * p.dout_row_stride + c]);
    dst[c] = acc;
  }
}

unsigned column_chunks(int C) {
  unsigned chunks = (static_cast<unsigned>(C) + EmbeddingTraits::kThreads - 1) / EmbeddingTraits::kThreads;
  return chunks > EmbeddingTraits::kMaxChunks ? EmbeddingTraits::kMaxChunks : chunks;
}

}  // namespace

void embedding_forward_cuda(const EmbeddingForwardParams& p, cudaStream_t stream) {
  if (p.N <= 0 || p.C <= 0) return;
  launch_kernel(embedding_forward_kernel, dim3(p.N, column_chunks(p.C)), dim3(EmbeddingTraits::kThreads), 0, stream, p);
}

EmbeddingBackwardPlan embedding_backward_plan(const int32_t* tokens, int N, int V) {
  std::vector<int32_t> count(static_cast<size_t>(V) + 1, 0);
  for (int i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      throw std::invalid_argument("embedding_backward_plan: token " + std::to_string(tokens[i]) + " at row " +
                                  std::to_string(i) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    ++count[tokens[i]];
  }
  EmbeddingBackwardPlan plan;
  plan.N = N;
  for (int v = 0; v < V; ++v) plan.n_rows += count[v] > 0;
  plan.data.assign(2 * static_cast<size_t>(plan.n_rows) + 1 + static_cast<size_t>(N), 0);
  int32_t* rows = plan.data.data() + plan.rows_offset();
  int32_t* offsets = plan.data.data() + plan.offsets_offset();
  int32_t* positions = plan.data.data() + plan.positions_offset();
  // start[v]: first slot of token v in positions (exclusive prefix sum over the vocabulary).
  std::vector<int32_t> start(static_cast<size_t>(V), 0);
  int32_t acc = 0, r = 0;
  for (int v = 0; v < V; ++v) {
    start[v] = acc;
    if (count[v] > 0) rows[r] = v, offsets[r] = acc, ++r;
    acc += count[v];
  }
  offsets[plan.n_rows] = acc;
  for (int i = 0; i < N; ++i) positions[start[tokens[i]]++] = i;  // stable: increasing i per token
  return plan;
}

void embedding_backward_cuda(const EmbeddingBackwardParams& p, cudaStream_t stream) {
  if (p.n_rows <= 0 || p.C <= 0) return;
  launch_kernel(embedding_backward_kernel, dim3(p.n_rows, column_chunks(p.C)), dim3(EmbeddingTraits::kThreads), 0,
                stream, p);
}

LT_CUDA_NAMESPACE_END
