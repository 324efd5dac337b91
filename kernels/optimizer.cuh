// Optimizer-side kernels on fp32 shards, the twins of lt::cpu::adamw_update / sum_squares /
// scale_inplace in include/llamatrain/ops_cpu.h (src/backend/cpu/optimizer_ops_cpu.cpp), plus the
// fp32 -> bf16 cast of the working weights. All arrays are flat, n elements, device pointers.
//   adamw:       m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//                p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
//                (fp32 gradient; wd = 0 turns the decoupled decay off; bias corrections computed
//                on the host in double and rounded to fp32, as the CPU op does); optionally also
//                writes param_bf16 = bf16(p) (round to nearest even).
//   sum_squares: sum x^2 in double, deterministic: a fixed grid (it depends only on n) writes one
//                double partial per block, then one block sums the partials in a fixed order.
//                No atomics; the same n gives the same bits on every run.
//   scale:       x *= s
//   cast:        out = bf16(x), round to nearest even
//   bf16 gradient shards (ZeRO 2/3 with --grad-reduce-dtype bf16, the twin of lt::GradShard,
//   grad_shard.h): AdamW and sum_squares read them widened to fp32; scale rounds to nearest;
//   add_stochastic_bf16 adds fp32 values and rounds each sum stochastically, with GradShard's
//   rounding and hash (unbiased: the expected sum is exact).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_compat.cuh"
#include "llamatrain/mix64.h"

LT_CUDA_NAMESPACE_BEGIN

struct AdamwParams {
  float* param = nullptr;               // (n) fp32 master weights, updated in place
  float* m = nullptr;                   // (n) first moment, updated in place
  float* v = nullptr;                   // (n) second moment, updated in place
  const float* grad = nullptr;          // (n) fp32 gradient, or
  const __nv_bfloat16* grad_bf16 = nullptr;  // (n) a bf16 one (grad null)
  __nv_bfloat16* param_bf16 = nullptr;  // (n) bf16 working copy (=), or nullptr to skip
  size_t n = 0;
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  int t = 1;                            // 1-based step
};

void adamw_update_cuda(const AdamwParams& p, cudaStream_t stream);

// Doubles of scratch sum_squares_cuda needs for n elements (one per block of the first pass).
size_t sum_squares_scratch_doubles(size_t n);
// *out = sum x[i]^2 (double, device pointer); scratch: sum_squares_scratch_doubles(n) doubles.
void sum_squares_cuda(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream);

void sum_squares_cuda(double* out, const __nv_bfloat16* x, size_t n, double* scratch, cudaStream_t stream);

// x[i] *= s (bf16: rounded to nearest even)
void scale_inplace_cuda(float* x, float s, size_t n, cudaStream_t stream);
void scale_inplace_cuda(__nv_bfloat16* x, float s, size_t n, cudaStream_t stream);
// y[0, n) += x[0, n) (a ZeRO-3 rank's reduced gradient piece into its shard).
void add_inplace_cuda(float* y, const float* x, size_t n, cudaStream_t stream);

// y[i] = bf16(float(y[i]) + x[i]) rounded stochastically, i < n, as lt::GradShard::add: the
// random 16 bits of element i are mix64(seed ^ (index0 + i)) (seed: mix64 of the shard's add
// count, index0: y's index in the shard; mix64 is llamatrain/mix64.h's, GradShard's hash).
void add_stochastic_bf16_cuda(__nv_bfloat16* y, const float* x, size_t n, uint64_t seed, size_t index0,
                              cudaStream_t stream);
// out[i] = bf16(x[i]) (round to nearest even)
void cast_f32_to_bf16_cuda(__nv_bfloat16* out, const float* x, size_t n, cudaStream_t stream);
// out[i] = float(x[i]) (exact)
void cast_bf16_to_f32_cuda(float* out, const __nv_bfloat16* x, size_t n, cudaStream_t stream);

LT_CUDA_NAMESPACE_END
