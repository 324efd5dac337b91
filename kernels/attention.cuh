// Causal self-attention with GQA and packed-example boundaries on the device, the twin of
// lt::cpu::attention_forward / attention_backward in include/llamatrain/ops_cpu.h
// (src/backend/cpu/attention_cpu.cpp). Storage bf16 (q, k, v, out, dout, dq, dk, dv); scores,
// softmax statistics and every sum in fp32; lse and the backward scratch D in fp32.
//
// Query t of head h attends to keys s of KV head h / (H / KVH) with
//   kb(t) <= s <= t,  kb(t) = clamp(seg_start[b,t], 0, t + 1)  (seg_start null: kb = 0),
// so kb = t + 1 is an empty row (out = 0, lse = -inf, dq = 0). With scale = 1/sqrt(hd):
//   S = Q K^T scale,  P = softmax over the allowed keys,  O = P V,  lse_t = log sum_s exp(S_ts).
// Backward recomputes P = exp(S - lse) from the lse cache (no (T,T) matrix is ever stored):
//   D_t = sum_c dO_tc O_tc,  dS = P * (dO V^T - D),  dQ = dS K scale,  dK = dS^T Q scale,  dV = P^T dO
// with dK, dV summed over the heads of each GQA group. dq, dk, dv are written (=), and the backward
// pass is deterministic: every output element is summed by one thread in a fixed order (no atomics).
//
// Flash-attention style tiling (one pass over the keys with an online softmax). Two implementations
// (AttentionParams::kernel): CUDA-core kernels for every supported head dim (attention.cu), and
// tensor-core kernels (mma.sync bf16, FlashAttention-2's partitioning) for head_dim 64 and 128
// (attention_tc.cu), which kAuto picks where they exist. Both give the same outputs up to rounding
// (the tensor-core path rounds P and dS to bf16 as mma operands, as FlashAttention-2 does).
// head_dim must be 16, 32, 64 or 128 (the instantiated sizes); anything else is rejected with
// std::invalid_argument.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

// A (B*T, n_heads, hd) bf16 tensor, possibly a view into a wider buffer (e.g. the fused qkv
// projection output): token row r = b*T + t starts at ptr + r * token_stride, head h of it at
// + h * head_stride (elements); the hd elements of a head are contiguous. The kernels move 16-byte
// vectors, so ptr must be 16-byte aligned and both strides multiples of 8 elements (checked).
template <class T>
struct AttentionHeads {
  T* ptr = nullptr;
  int64_t token_stride = 0, head_stride = 0;
};

// Which kernels run: kAuto = tensor cores for head_dim 64 and 128, CUDA cores otherwise.
// kTensorCores with another head dim is rejected (std::invalid_argument).
enum class AttentionKernel { kAuto, kCudaCores, kTensorCores };

struct AttentionParams {
  // Forward outputs (out is also a backward input).
  AttentionHeads<__nv_bfloat16> out;        // (B,T,H,hd)
  float* lse = nullptr;                     // (B,H,T) contiguous; -inf for an empty row
  // Inputs.
  AttentionHeads<const __nv_bfloat16> q;    // (B,T,H,hd)
  AttentionHeads<const __nv_bfloat16> k;    // (B,T,KVH,hd)
  AttentionHeads<const __nv_bfloat16> v;    // (B,T,KVH,hd)
  const int32_t* seg_start = nullptr;       // (B,T) contiguous, or null (one example per row)
  // Backward only.
  AttentionHeads<const __nv_bfloat16> dout; // (B,T,H,hd)
  AttentionHeads<__nv_bfloat16> dq;         // (B,T,H,hd) =
  AttentionHeads<__nv_bfloat16> dk;         // (B,T,KVH,hd) =
  AttentionHeads<__nv_bfloat16> dv;         // (B,T,KVH,hd) =
  float* dsum = nullptr;                    // (B,H,T) contiguous scratch: D = rowsum(dout * out)
  int B = 0, T = 0, H = 0, KVH = 0, hd = 0; // H a multiple of KVH
  AttentionKernel kernel = AttentionKernel::kAuto;
};

// Forward: writes out and lse from q, k, v, seg_start.
void attention_forward_cuda(const AttentionParams& p, cudaStream_t stream);
// Backward: writes dq, dk, dv (and the dsum scratch) from dout, out, lse, q, k, v, seg_start.
// Three launches on the stream: D, then dk/dv, then dq.
void attention_backward_cuda(const AttentionParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
