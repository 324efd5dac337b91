// cuDNN's fused scaled-dot-product attention as the alternative to our kernel (--attention cudnn)
// and as the yardstick it is timed against (tests/gpu). Same contract as attention_forward_cuda /
// attention_backward_cuda (kernels/attention.cuh: layouts, strides, lse), with two differences:
// * one example per row only: p.seg_start must be null. Packed examples (seg_start > 0 inside a
//   row) are not a plain causal mask, and cuDNN 9 expresses them only through ragged (THD) tensors
//   that would need a different layout and per-example lengths; callers refuse such batches.
// * the backward pass is not deterministic (cuDNN accumulates dQ with atomics).
// The forward writes lse exactly as our kernel does: cuDNN's softmax "Stats" is
// max + log(sum exp(S - max)) of the scaled scores, the natural-log log-sum-exp, (B,H,T) fp32, so
// the two paths share the lse buffer and either backward can follow either forward. The backward
// also writes p.dsum (cuDNN's softmax_sum, D = rowsum(dout * out)), fp32 (B,H,T).
//
// Built with the backend graph API (cudnn_graph.h): per direction and shape one operation graph
// of matmuls, pointwise ops and reductions in the pattern cuDNN fuses into one flash-attention
// engine (Q K^T, scale, causal mask, softmax with stats, P V, and the five-matmul backward), built
// once and cached with its execution plan. bf16 tensors, fp32 compute, scale 1/sqrt(hd), GQA with
// H a multiple of KVH. cuDNN is opened with dlopen on first use (cudnn_library.h).
//
// GPU build only; the simulator build's definitions (sim/cudnn_attention_sim.cpp) throw, since
// cuDNN runs only on a GPU.
#pragma once
#include "attention.cuh"

LT_CUDA_NAMESPACE_BEGIN

// Loads cuDNN and creates its handle now, so that a missing library or an unusable GPU is reported
// when --attention cudnn is chosen rather than at the first step. Throws lt::Error (in the
// simulator build always, saying that cuDNN runs only on a GPU).
void cudnn_attention_prepare();
// Writes p.out and p.lse from p.q, p.k, p.v (p.seg_start must be null).
void cudnn_attention_forward(const AttentionParams& p, cudaStream_t stream);
// Writes p.dq, p.dk, p.dv (=) and p.dsum from p.dout, p.out, p.lse, p.q, p.k, p.v.
void cudnn_attention_backward(const AttentionParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
