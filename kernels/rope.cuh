// RoPE forward/backward on the device (Meta adjacent-pair layout), the twin of
// lt::cpu::rope_forward / rope_backward in include/llamatrain/ops_cpu.h.
// Storage bf16, math fp32. One launch rotates up to two tensors that share the positions: q
// (B,T,n_heads,hd) and k (B,T,n_kv_heads,hd). Pair (2i, 2i+1) of every head of token (b,t) is
// rotated by angle p * theta^(-2i/hd), p = pos[b*T + t] (positions restart at packed-example
// boundaries) or t when pos is null:
//   out[2i]   = x[2i] cos - x[2i+1] sin
//   out[2i+1] = x[2i] sin + x[2i+1] cos
// The backward pass applies the transposed rotation (angle -> -angle), dx = R^T dout (=).
// Every pair is read into registers before it is written, so out may alias x (in place).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

// One tensor of the launch. Token row r = b*T + t starts at r * *_token_stride; head h of it at
// h * *_head_stride (elements); the hd elements of a head are contiguous.
struct RopeTensor {
  __nv_bfloat16* out = nullptr;     // (B*T, H, hd) =; may equal x
  const __nv_bfloat16* x = nullptr; // (B*T, H, hd)
  int H = 0;                        // heads; 0 (or out == nullptr) skips the tensor
  int64_t x_token_stride = 0, x_head_stride = 0;
  int64_t out_token_stride = 0, out_head_stride = 0;
};

struct RopeParams {
  RopeTensor q;                   // (B,T,n_heads,hd)
  RopeTensor k;                   // (B,T,n_kv_heads,hd); k.H = 0 when only one tensor is rotated
  const int32_t* pos = nullptr;   // (B,T) contiguous, or null for p = t
  int B = 0, T = 0, hd = 0;       // hd even
  float theta = 10000.f;
};

// Forward: out = R(p) x for q and k.
void rope_forward_cuda(const RopeParams& p, cudaStream_t stream);
// Backward: dx = R(p)^T dout; in the params, x is dout and out is dx.
void rope_backward_cuda(const RopeParams& p, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
