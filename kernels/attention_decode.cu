// Decoding attention (see attention_decode.cuh): one block per query head. The block scores the
// cached positions (a thread per position, strided), takes the maximum and the sum of the
// exponentials by shared-memory trees, then each thread sums one output dimension over the
// positions in order. Decoding reads the whole cache once per token: memory-bound, so one pass.
#include "attention_decode.cuh"

#include <stdexcept>
#include <string>

LT_CUDA_NAMESPACE_BEGIN
namespace {

struct DecodeTraits {
  static constexpr int kThreads = 128;
};

// The maximum (is_max) or the sum of v over the block, in a fixed tree order; every thread gets it.
__device__ __forceinline__ float block_reduce(float v, float* tree, bool is_max) {
  const int t = threadIdx.x;
  tree[t] = v;
  __syncthreads();
  for (int w = DecodeTraits::kThreads / 2; w > 0; w >>= 1) {
    if (t < w) tree[t] = is_max ? fmaxf(tree[t], tree[t + w]) : tree[t] + tree[t + w];
    __syncthreads();
  }
  const float r = tree[0];
  __syncthreads();  // tree is reused by the next reduction
  return r;
}

__global__ void __launch_bounds__(DecodeTraits::kThreads) attention_decode_kernel(AttentionDecodeParams p) {
  __shared__ float tree[DecodeTraits::kThreads];
  LT_DYNAMIC_SMEM(float, smem);  // q as fp32 (hd), then the scores (n)
  float* qf = smem;
  float* scores = smem + p.hd;
  const int h = blockIdx.x, kvh = h / (p.H / p.KVH), t = threadIdx.x;
  const float scale = 1.0f / sqrtf(static_cast<float>(p.hd));
  for (int i = t; i < p.hd; i += DecodeTraits::kThreads) qf[i] = __bfloat162float(p.q[h * p.hd + i]);
  __syncthreads();
  float mx = -INFINITY;
  for (int s = t; s < p.n; s += DecodeTraits::kThreads) {
    const __nv_bfloat16* ks = p.k + s * p.kv_stride + kvh * p.hd;
    float dot = 0.f;
    for (int i = 0; i < p.hd; ++i) dot += qf[i] * __bfloat162float(ks[i]);
    scores[s] = dot * scale;
    mx = fmaxf(mx, scores[s]);
  }
  mx = block_reduce(mx, tree, true);
  float sum = 0.f;
  for (int s = t; s < p.n; s += DecodeTraits::kThreads) sum += (scores[s] = expf(scores[s] - mx));
  sum = block_reduce(sum, tree, false);  // its barriers also publish every thread's scores
  for (int i = t; i < p.hd; i += DecodeTraits::kThreads) {
    const __nv_bfloat16* vi = p.v + kvh * p.hd + i;
    float acc = 0.f;
    for (int s = 0; s < p.n; ++s) acc += scores[s] * __bfloat162float(vi[s * p.kv_stride]);
    p.out[h * p.hd + i] = __float2bfloat16(acc / sum);
  }
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("attention_decode: " + what);
}

}  // namespace

void attention_decode_cuda(const AttentionDecodeParams& p, cudaStream_t stream) {
  check(p.out && p.q && p.k && p.v, "a null pointer");
  check(p.n >= 1 && p.n <= kAttentionDecodeMaxPositions,
        "n = " + std::to_string(p.n) + " cached positions, expected 1.." + std::to_string(kAttentionDecodeMaxPositions));
  check(p.KVH >= 1 && p.H >= p.KVH && p.H % p.KVH == 0, "H must be a multiple of KVH");
  check(p.hd >= 1 && p.hd <= 256, "hd = " + std::to_string(p.hd) + ", expected 1..256");
  check(p.kv_stride >= static_cast<int64_t>(p.KVH) * p.hd, "kv_stride below KVH * hd");
  const size_t smem = sizeof(float) * (static_cast<size_t>(p.hd) + static_cast<size_t>(p.n));
  launch_kernel(attention_decode_kernel, dim3(p.H), dim3(DecodeTraits::kThreads), smem, stream, p);
}

LT_CUDA_NAMESPACE_END
