// The tensor-core path of causal attention (head_dim 64 and 128): the same semantics, arguments and
// outputs as attention.cuh's kernels (out, fp32 lse; dq, dk, dv with `=`), computed with
// mma.sync m16n8k16 bf16 (fp32 accumulation), ldmatrix and cp.async double buffering in the work
// partitioning of FlashAttention-2. attention_forward_cuda / attention_backward_cuda dispatch here
// (AttentionParams::kernel); nothing else calls these. Design and tile sizes: attention_tc.cu.
#pragma once
#include "attention.cuh"

LT_CUDA_NAMESPACE_BEGIN

// True for the head dims the tensor-core kernels are instantiated for.
inline bool attention_tc_supports(int hd) { return hd == 64 || hd == 128; }

// Arguments already checked by the caller (attention.cu's check_shape / check_heads).
void attention_tc_forward(const AttentionParams& p, cudaStream_t stream);
// dq, dk, dv from dout, out (through the dsum scratch, which the caller has filled), lse, q, k, v.
void attention_tc_backward(const AttentionParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
