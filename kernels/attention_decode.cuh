// Decoding attention on the device: one new query per head against a KV cache, the twin of
// lt::cpu::attention_decode (include/llamatrain/ops_cpu.h). Storage bf16 (q, the cache, out); the
// scores, softmax and sums in fp32. With scale = 1/sqrt(hd), head h reads KV head h / (H / KVH):
//   out_h = sum_{s < n} softmax_s(q_h . k_s * scale) v_s
// over the n cached positions 0..n-1 (the new token's own key and value included). Deterministic:
// fixed reduction orders, no atomics.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

struct AttentionDecodeParams {
  __nv_bfloat16* out = nullptr;      // (H, hd) =
  const __nv_bfloat16* q = nullptr;  // (H, hd)
  const __nv_bfloat16* k = nullptr;  // position s's KV heads at k + s * kv_stride: (KVH, hd)
  const __nv_bfloat16* v = nullptr;  // likewise
  int64_t kv_stride = 0;             // elements between two positions' rows, >= KVH * hd
  int n = 0, H = 0, KVH = 0, hd = 0; // H a multiple of KVH
};

// The most cached positions one call takes (its scores fit a block's default 48 KiB of shared memory).
constexpr int kAttentionDecodeMaxPositions = 11776;

// Throws std::invalid_argument for shapes it does not take (n outside [1, max], H not a multiple of
// KVH, hd outside [1, 256], kv_stride < KVH * hd, a null pointer).
void attention_decode_cuda(const AttentionDecodeParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
