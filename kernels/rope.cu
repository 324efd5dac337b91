// RoPE kernels: one block per token row. The block first computes the hd/2 (cos, sin) pairs of its
// position into shared memory (one sincospif per pair, not per head), then its threads walk the
// (head, pair) index space of q and then k. Semantics: src/backend/cpu/rope_cpu.cpp. Angles are
// fp32 here (the CPU op computes them in double), in half turns (radians / pi): sincospif reduces
// its argument exactly, where sincosf carries a slow path for large arguments (Payne-Hanek, a
// 32-byte stack frame in every block; GpuCheck.rope_no_stack checks ptxas reports none). The
// angle's rounding error, a few 2^-24 * p radians, stays well below bf16's 2^-9 relative step
// for p up to ~10^5.
#include "rope.cuh"

#include <stdexcept>

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct RopeTraits {
  static constexpr int kThreads = 128;  // per token row; 4 warps
};

// Rotates every pair of one tensor's token row with the (cos, sin) table cs (interleaved).
__device__ __forceinline__ void rope_rotate_row(const RopeTensor& t, int64_t row, int half, const float* cs) {
  if (t.H <= 0 || t.out == nullptr) return;
  const __nv_bfloat16* x = t.x + row * t.x_token_stride;
  __nv_bfloat16* out = t.out + row * t.out_token_stride;
  const int n_pairs = t.H * half;
  for (int j = threadIdx.x; j < n_pairs; j += blockDim.x) {
    const int h = j / half, i = j - h * half;
    const __nv_bfloat16* xp = x + h * t.x_head_stride + 2 * i;
    __nv_bfloat16* op = out + h * t.out_head_stride + 2 * i;
    const float x0 = __bfloat162float(xp[0]), x1 = __bfloat162float(xp[1]);
    const float c = cs[2 * i], s = cs[2 * i + 1];
    op[0] = __float2bfloat16(x0 * c - x1 * s);
    op[1] = __float2bfloat16(x0 * s + x1 * c);
  }
}

// sign = +1 forward, -1 backward (the transposed rotation).
__global__ void __launch_bounds__(RopeTraits::kThreads) rope_kernel(RopeParams p, float sign) {
  LT_DYNAMIC_SMEM(float, cs);  // (hd/2, 2): cos, sign * sin
  const int64_t row = blockIdx.x;
  const int half = p.hd / 2;
  const float pos = p.pos ? static_cast<float>(p.pos[row]) : static_cast<float>(row % p.T);
  constexpr float kInvPi = 0.318309886183790671538f;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // theta^(-2i/hd), the same formula as the CPU op, in fp32, as half turns per position.
    const float freq = powf(p.theta, -2.0f * static_cast<float>(i) / static_cast<float>(p.hd));
    float s, c;
    sincospif(pos * (freq * kInvPi), &s, &c);
    cs[2 * i] = c;
    cs[2 * i + 1] = sign * s;
  }
  __syncthreads();
  rope_rotate_row(p.q, row, half, cs);
  rope_rotate_row(p.k, row, half, cs);
}

void rope_launch(const RopeParams& p, float sign, cudaStream_t stream) {
  if (p.B <= 0 || p.T <= 0 || p.hd <= 0) return;
  if (p.hd % 2 != 0) throw std::invalid_argument("rope_cuda: head_dim must be even");
  const size_t smem = static_cast<size_t>(p.hd) * sizeof(float);
  launch_kernel(rope_kernel, dim3(static_cast<unsigned>(p.B) * static_cast<unsigned>(p.T)), dim3(RopeTraits::kThreads),
                smem, stream, p, sign);
}

}  // namespace

void rope_forward_cuda(const RopeParams& p, cudaStream_t stream) { rope_launch(p, 1.f, stream); }

void rope_backward_cuda(const RopeParams& p, cudaStream_t stream) { rope_launch(p, -1.f, stream); }

LT_CUDA_NAMESPACE_END
