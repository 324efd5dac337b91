// Causal attention kernels (GQA, packed examples), flash-attention style: tiles of queries and
// keys are staged in shared memory and the (T,T) score matrix never exists in global memory.
// Semantics: src/backend/cpu/attention_cpu.cpp; formulas in attention.cuh.
//
// Thread layout (every kernel, 128 threads): a tile row is owned by 8 consecutive lanes
// (tx = lane % 8), and each thread owns R consecutive rows (ty = threadIdx.x / 8, rows ty*R ...).
// Of a (rows, keys) score tile a thread holds the columns tx + 8j; of a (rows, hd) accumulator it
// holds the column pairs 2(tx + 8jj), 2(tx + 8jj) + 1. The row statistics of the online softmax
// are therefore merged with three xor-shuffles within 8 lanes.
//
// * forward: one block per (query tile, head, batch). Loops over key tiles from the smallest key
//   any row of the tile may see to the tile's last query (tiles above the diagonal or before every
//   row's example start are never visited), S = Q K^T in registers, running max m and sum l per
//   row (exp2 domain), P through shared memory into O += P V. out = O / l, lse = m + log l.
// * backward, three launches:
//   1. D = rowsum(dO * O), one warp per (token, head).
//   2. dK, dV: one block per (key tile, KV head, batch); loops over the heads of the group and
//      the query tiles from the key tile's first key on (a query tile none of whose rows can see
//      any key of the tile is skipped), recomputing P^T = exp(S^T - lse) and
//      dS^T = P^T (dP^T - D), accumulating dV += P^T dO and dK += dS^T Q in registers.
//   3. dQ: one block per (query tile, head, batch) looping over the key tiles as the forward does,
//      dQ += dS K in registers.
//   Each output element is summed by exactly one thread in a fixed order: deterministic.
//
// Shared memory tiles hold bf16 rows with a stride of hd + 8 elements: rows stay 16-byte aligned
// for vector loads and consecutive rows start 4 banks apart, so the 8 rows read by the 8 lanes of
// a row group hit distinct banks. The fp32 P / dS tiles get one padding column for the same reason.
// Every tile configuration stays within the 48 KiB of static shared memory (sizes per kernel in
// AttentionTiles).
//
// The math runs on the CUDA cores (fp32 FMAs on bf16 values unpacked in registers), for every head
// dim; head_dim 64 and 128 go to the tensor-core kernels of attention_tc.cu unless the caller asks
// for these (AttentionKernel::kCudaCores). Loops over register arrays have compile-time trip
// counts, which nvcc unrolls fully (the build log shows 0-byte stack frames); `#pragma unroll` is
// left out because g++ warns about it in the simulator build.
#include "attention.cuh"

#include "attention_tc.cuh"

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

LT_CUDA_NAMESPACE_BEGIN
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

struct AttentionLayout {
  static constexpr int kThreads = 128;                        // 4 warps
  static constexpr int kColThreads = 8;                       // lanes sharing a tile row
  static constexpr int kRowThreads = kThreads / kColThreads;  // 16 row groups
  static constexpr int kDsumRowsPerBlock = kThreads / 32;     // D kernel: one warp per (token, head)
};

// Tile sizes (rows of queries M, keys N) per kernel and head dim. Limits: M, N multiples of 16 where
// they are the row-owner dimension, multiples of 8 otherwise; static smem <= 48 KiB; accumulators
// (R rows x hd/8 columns per thread) small enough for zero spills.
template <int HD>
struct AttentionTiles;
template <>
struct AttentionTiles<16> {
  static constexpr int kFwdM = 32, kFwdN = 32, kKvN = 32, kKvM = 32, kDqM = 32, kDqN = 32;
};
template <>
struct AttentionTiles<32> {
  static constexpr int kFwdM = 32, kFwdN = 32, kKvN = 32, kKvM = 32, kDqM = 32, kDqN = 32;
};
template <>
struct AttentionTiles<64> {
  static constexpr int kFwdM = 64, kFwdN = 64, kKvN = 64, kKvM = 32, kDqM = 64, kDqN = 32;
};
template <>
struct AttentionTiles<128> {
  static constexpr int kFwdM = 64, kFwdN = 32, kKvN = 32, kKvM = 32, kDqM = 32, kDqN = 32;
};

template <int HD>
struct AttentionTraits : AttentionTiles<HD> {
  static_assert(HD % 16 == 0, "head_dim must be a multiple of 16");
  static constexpr int kRowVecs = (HD + 8) / 8;  // uint4 per smem row (stride hd + 8 bf16)
  static constexpr int kRowWords = (HD + 8) / 2; // 32-bit words per smem row
  static constexpr int kChunks = HD / 8;         // 16-byte chunks of data per row
  static constexpr int kOutCols = HD / AttentionLayout::kColThreads;  // accumulator columns per thread
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float bf16_lo(uint32_t w) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(w >> 16)));
}

// First key query t may see: seg_start clamped to [0, t + 1] as the CPU op does.
__device__ __forceinline__ int key_begin(const int32_t* seg_start, int b, int T, int t) {
  if (!seg_start) return 0;
  const int s = seg_start[static_cast<int64_t>(b) * T + t];
  return imin(imax(s, 0), t + 1);
}

// Rows [row0, row0 + ROWS) of head `head` of x in batch row b -> smem tile (ROWS, hd + 8); rows at
// or past row_end are zero (never read out of bounds, and a zero V row adds nothing).
template <int HD, int ROWS>
__device__ __forceinline__ void load_tile(uint4* dst, const AttentionHeads<const bf16>& x, int b, int T, int head,
                                          int row0, int row_end) {
  using Tr = AttentionTraits<HD>;
  for (int i = threadIdx.x; i < ROWS * Tr::kChunks; i += AttentionLayout::kThreads) {
    const int r = i / Tr::kChunks, c = i - r * Tr::kChunks;
    const int t = row0 + r;
    uint4 val{0u, 0u, 0u, 0u};
    if (t < row_end)
      val = *reinterpret_cast<const uint4*>(x.ptr + (static_cast<int64_t>(b) * T + t) * x.token_stride +
                                            static_cast<int64_t>(head) * x.head_stride + c * 8);
    dst[r * Tr::kRowVecs + c] = val;
  }
}

__device__ __forceinline__ float dot_word(uint32_t a, uint32_t b, float acc) {
  acc = fmaf(bf16_lo(a), bf16_lo(b), acc);
  return fmaf(bf16_hi(a), bf16_hi(b), acc);
}

// acc[i][j] = sum_d A[ra + i][d] * B[tx + 8j][d] over the hd columns of two smem tiles: the score
// tile (or its transpose) of R rows x C columns per thread, in a fixed d order.
template <int HD, int R, int C>
__device__ __forceinline__ void tile_dot(float (&acc)[R][C], const uint4* A, int ra, const uint4* B, int tx) {
  using Tr = AttentionTraits<HD>;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = 0.f;
  for (int c = 0; c < Tr::kChunks; ++c) {
    uint4 a[R], b[C];
    for (int i = 0; i < R; ++i) a[i] = A[(ra + i) * Tr::kRowVecs + c];
    for (int j = 0; j < C; ++j) b[j] = B[(tx + 8 * j) * Tr::kRowVecs + c];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) {
        float s = acc[i][j];
        s = dot_word(a[i].x, b[j].x, s);
        s = dot_word(a[i].y, b[j].y, s);
        s = dot_word(a[i].z, b[j].z, s);
        s = dot_word(a[i].w, b[j].w, s);
        acc[i][j] = s;
      }
  }
}

// acc[i][2jj + e] += sum_n P[ra + i][n] * X[n][2(tx + 8jj) + e] for n < N: an fp32 smem tile P
// (row stride PS) times a bf16 smem tile X (N, hd), into this thread's accumulator columns.
template <int HD, int R, int N, int PS>
__device__ __forceinline__ void tile_pv(float (&acc)[R][HD / 8], const float* P, int ra, const uint4* X, int tx) {
  using Tr = AttentionTraits<HD>;
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(X);
  for (int n = 0; n < N; ++n) {
    float pv[R];
    for (int i = 0; i < R; ++i) pv[i] = P[(ra + i) * PS + n];
    for (int jj = 0; jj < HD / 16; ++jj) {
      const uint32_t w = xw[n * Tr::kRowWords + tx + 8 * jj];
      const float lo = bf16_lo(w), hi = bf16_hi(w);
      for (int i = 0; i < R; ++i) {
        acc[i][2 * jj] = fmaf(pv[i], lo, acc[i][2 * jj]);
        acc[i][2 * jj + 1] = fmaf(pv[i], hi, acc[i][2 * jj + 1]);
      }
    }
  }
}

// Row t (< T) of head `head` of y = acc * mul, this thread's column pairs, in bf16.
template <int HD>
__device__ __forceinline__ void store_row(const AttentionHeads<bf16>& y, int b, int T, int head, int t,
                                          const float (&acc)[HD / 8], float mul, int tx) {
  bf16* row = y.ptr + (static_cast<int64_t>(b) * T + t) * y.token_stride + static_cast<int64_t>(head) * y.head_stride;
  for (int jj = 0; jj < HD / 16; ++jj)
    *reinterpret_cast<__nv_bfloat162*>(row + 2 * (tx + 8 * jj)) =
        __floats2bfloat162_rn(acc[2 * jj] * mul, acc[2 * jj + 1] * mul);
}

// Smallest key_begin over the rows of a tile (INT_MAX for rows past T): every thread reads the
// same smem values, so the result (and any branch on it) is uniform over the block.
template <int M>
__device__ __forceinline__ int tile_min_key(const int* kb) {
  int m = INT_MAX;
  for (int i = 0; i < M; ++i) m = imin(m, kb[i]);
  return m;
}

template <int HD>
__global__ void __launch_bounds__(AttentionLayout::kThreads) attention_forward_kernel(AttentionParams p) {
  using Tr = AttentionTraits<HD>;
  using L = AttentionLayout;
  constexpr int BM = Tr::kFwdM, BN = Tr::kFwdN;
  constexpr int RM = BM / L::kRowThreads, CN = BN / L::kColThreads, CO = Tr::kOutCols;
  constexpr int PS = BN + 1;
  __shared__ uint4 q_s[BM * Tr::kRowVecs];
  __shared__ uint4 k_s[BN * Tr::kRowVecs];
  __shared__ uint4 v_s[BN * Tr::kRowVecs];
  __shared__ float p_s[BM * PS];
  __shared__ int kb_s[BM];

  const int T = p.T, q0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, g = h / (p.H / p.KVH);
  const int tx = threadIdx.x % L::kColThreads, ty = threadIdx.x / L::kColThreads, r0 = ty * RM;
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HD));  // scores in the exp2 domain

  for (int i = threadIdx.x; i < BM; i += L::kThreads) {
    const int t = q0 + i;
    kb_s[i] = t < T ? key_begin(p.seg_start, b, T, t) : INT_MAX;
  }
  load_tile<HD, BM>(q_s, p.q, b, T, h, q0, T);
  __syncthreads();
  const int kmin = tile_min_key<BM>(kb_s), kend = imin(q0 + BM, T);
  int kb_r[RM], t_r[RM];
  float o[RM][CO], m[RM], l[RM];
  for (int i = 0; i < RM; ++i) {
    kb_r[i] = kb_s[r0 + i], t_r[i] = q0 + r0 + i;
    m[i] = -INFINITY, l[i] = 0.f;
    for (int c = 0; c < CO; ++c) o[i][c] = 0.f;
  }

  for (int s0 = kmin; s0 < kend; s0 += BN) {
    __syncthreads();  // the previous tile's readers of k_s, v_s, p_s are done
    load_tile<HD, BN>(k_s, p.k, b, T, g, s0, kend);
    load_tile<HD, BN>(v_s, p.v, b, T, g, s0, kend);
    __syncthreads();
    float s[RM][CN];
    tile_dot<HD, RM, CN>(s, q_s, r0, k_s, tx);
    for (int i = 0; i < RM; ++i) {
      float mt = -INFINITY;
      for (int j = 0; j < CN; ++j) {
        const int key = s0 + tx + 8 * j;
        s[i][j] = (key >= kb_r[i] && key <= t_r[i]) ? s[i][j] * scale_log2 : -INFINITY;
        mt = fmaxf(mt, s[i][j]);
      }
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 4));
      const float mn = fmaxf(m[i], mt);
      const float mu = mn == -INFINITY ? 0.f : mn;  // no allowed key yet: keep exp2 away from -inf - -inf
      const float corr = exp2f(m[i] - mu);
      m[i] = mn;
      // l stays a per-thread partial sum over this thread's columns (the 8 partials share m);
      // they are added once at the end.
      float ls = 0.f;
      for (int j = 0; j < CN; ++j) {
        const float pv = exp2f(s[i][j] - mu);
        ls += pv;
        p_s[(r0 + i) * PS + tx + 8 * j] = pv;
      }
      l[i] = l[i] * corr + ls;
      for (int c = 0; c < CO; ++c) o[i][c] *= corr;
    }
    __syncthreads();
    tile_pv<HD, RM, BN, PS>(o, p_s, r0, v_s, tx);
  }

  for (int i = 0; i < RM; ++i) {
    float lt = l[i];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    lt += __shfl_xor_sync(0xffffffffu, lt, 4);
    const int t = t_r[i];
    if (t >= T) continue;
    store_row<HD>(p.out, b, T, h, t, o[i], lt > 0.f ? 1.f / lt : 0.f, tx);
    if (tx == 0)
      p.lse[(static_cast<int64_t>(b) * p.H + h) * T + t] = lt > 0.f ? (m[i] + log2f(lt)) * kLn2 : -INFINITY;
  }
}

// D[b,h,t] = sum_c dout[b,t,h,c] * out[b,t,h,c]: one warp per (b, t, h), lanes over column pairs,
// then a fixed xor-shuffle tree.
__global__ void __launch_bounds__(AttentionLayout::kThreads) attention_dsum_kernel(AttentionParams p) {
  const int64_t n_rows = static_cast<int64_t>(p.B) * p.T * p.H;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * AttentionLayout::kDsumRowsPerBlock + threadIdx.x / 32;
  if (row >= n_rows) return;  // whole warps only: the shuffles below see full warps
  const int lane = threadIdx.x % 32;
  const int h = static_cast<int>(row % p.H);
  const int64_t bt = row / p.H;
  const bf16* o = p.out.ptr + bt * p.out.token_stride + h * p.out.head_stride;
  const bf16* d = p.dout.ptr + bt * p.dout.token_stride + h * p.dout.head_stride;
  float acc = 0.f;
  for (int c = 2 * lane; c < p.hd; c += 64) {
    const float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + c));
    const float2 df = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(d + c));
    acc = fmaf(of.x, df.x, acc);
    acc = fmaf(of.y, df.y, acc);
  }
  for (int k = 16; k > 0; k >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, k);
  if (lane == 0) {
    const int64_t b = bt / p.T, t = bt % p.T;
    p.dsum[(b * p.H + h) * p.T + t] = acc;
  }
}

template <int HD>
__global__ void __launch_bounds__(AttentionLayout::kThreads) attention_dkdv_kernel(AttentionParams p) {
  using Tr = AttentionTraits<HD>;
  using L = AttentionLayout;
  constexpr int BN = Tr::kKvN, BM = Tr::kKvM;  // keys owned by the block, queries per step
  constexpr int RN = BN / L::kRowThreads, CM = BM / L::kColThreads, CO = Tr::kOutCols;
  constexpr int PS = BM + 1;
  __shared__ uint4 k_s[BN * Tr::kRowVecs];
  __shared__ uint4 v_s[BN * Tr::kRowVecs];
  __shared__ uint4 q_s[BM * Tr::kRowVecs];
  __shared__ uint4 do_s[BM * Tr::kRowVecs];
  __shared__ float p_s[BN * PS];   // P^T (keys, queries)
  __shared__ float ds_s[BN * PS];  // dS^T
  __shared__ float lse_s[BM], d_s[BM];
  __shared__ int kb_s[BM];

  const int T = p.T, s0 = blockIdx.x * BN, g = blockIdx.y, b = blockIdx.z, group = p.H / p.KVH;
  const int tx = threadIdx.x % L::kColThreads, ty = threadIdx.x / L::kColThreads, r0 = ty * RN;
  const float scale = 1.f / sqrtf(static_cast<float>(HD)), scale_log2 = kLog2e * scale;
  const int kend = imin(s0 + BN, T);

  load_tile<HD, BN>(k_s, p.k, b, T, g, s0, kend);
  load_tile<HD, BN>(v_s, p.v, b, T, g, s0, kend);
  float dk[RN][CO], dv[RN][CO];
  for (int i = 0; i < RN; ++i)
    for (int c = 0; c < CO; ++c) dk[i][c] = 0.f, dv[i][c] = 0.f;

  for (int h = g * group; h < (g + 1) * group; ++h) {
    const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * T;  // lse / dsum row of (b, h)
    // Queries before s0 cannot see any key of the tile (causality).
    for (int q0 = s0; q0 < T; q0 += BM) {
      __syncthreads();  // the previous step's readers of the query-side tiles are done
      for (int i = threadIdx.x; i < BM; i += L::kThreads) {
        const int t = q0 + i;
        const bool in = t < T;
        kb_s[i] = in ? key_begin(p.seg_start, b, T, t) : INT_MAX;
        lse_s[i] = in ? p.lse[stat + t] * kLog2e : 0.f;
        d_s[i] = in ? p.dsum[stat + t] : 0.f;
      }
      __syncthreads();
      if (tile_min_key<BM>(kb_s) >= kend) continue;  // every row starts after the tile's last key
      load_tile<HD, BM>(q_s, p.q, b, T, h, q0, T);
      load_tile<HD, BM>(do_s, p.dout, b, T, h, q0, T);
      __syncthreads();
      float sp[RN][CM], dp[RN][CM];
      tile_dot<HD, RN, CM>(sp, k_s, r0, q_s, tx);   // S^T (unscaled)
      tile_dot<HD, RN, CM>(dp, v_s, r0, do_s, tx);  // dP^T = V dO^T
      for (int i = 0; i < RN; ++i) {
        const int key = s0 + r0 + i;
        for (int j = 0; j < CM; ++j) {
          const int mq = tx + 8 * j, t = q0 + mq;
          // t >= T rows have kb = INT_MAX; keys >= T exceed every valid t: both masked.
          const bool allowed = key >= kb_s[mq] && key <= t;
          const float pv = allowed ? exp2f(sp[i][j] * scale_log2 - lse_s[mq]) : 0.f;
          p_s[(r0 + i) * PS + mq] = pv;
          ds_s[(r0 + i) * PS + mq] = allowed ? pv * (dp[i][j] - d_s[mq]) : 0.f;
        }
      }
      __syncthreads();
      tile_pv<HD, RN, BM, PS>(dv, p_s, r0, do_s, tx);
      tile_pv<HD, RN, BM, PS>(dk, ds_s, r0, q_s, tx);
    }
  }

  for (int i = 0; i < RN; ++i) {
    const int key = s0 + r0 + i;
    if (key >= T) continue;
    store_row<HD>(p.dk, b, T, g, key, dk[i], scale, tx);
    store_row<HD>(p.dv, b, T, g, key, dv[i], 1.f, tx);
  }
}

template <int HD>
__global__ void __launch_bounds__(AttentionLayout::kThreads) attention_dq_kernel(AttentionParams p) {
  using Tr = AttentionTraits<HD>;
  using L = AttentionLayout;
  constexpr int BM = Tr::kDqM, BN = Tr::kDqN;
  constexpr int RM = BM / L::kRowThreads, CN = BN / L::kColThreads, CO = Tr::kOutCols;
  constexpr int PS = BN + 1;
  __shared__ uint4 q_s[BM * Tr::kRowVecs];
  __shared__ uint4 do_s[BM * Tr::kRowVecs];
  __shared__ uint4 k_s[BN * Tr::kRowVecs];
  __shared__ uint4 v_s[BN * Tr::kRowVecs];
  __shared__ float ds_s[BM * PS];
  __shared__ int kb_s[BM];

  const int T = p.T, q0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, g = h / (p.H / p.KVH);
  const int tx = threadIdx.x % L::kColThreads, ty = threadIdx.x / L::kColThreads, r0 = ty * RM;
  const float scale = 1.f / sqrtf(static_cast<float>(HD)), scale_log2 = kLog2e * scale;
  const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * T;

  for (int i = threadIdx.x; i < BM; i += L::kThreads) {
    const int t = q0 + i;
    kb_s[i] = t < T ? key_begin(p.seg_start, b, T, t) : INT_MAX;
  }
  load_tile<HD, BM>(q_s, p.q, b, T, h, q0, T);
  load_tile<HD, BM>(do_s, p.dout, b, T, h, q0, T);
  __syncthreads();
  const int kmin = tile_min_key<BM>(kb_s), kend = imin(q0 + BM, T);
  int kb_r[RM], t_r[RM];
  float lse_r[RM], d_r[RM], dq[RM][CO];
  for (int i = 0; i < RM; ++i) {
    const int t = q0 + r0 + i;
    kb_r[i] = kb_s[r0 + i], t_r[i] = t;
    lse_r[i] = t < T ? p.lse[stat + t] * kLog2e : 0.f;
    d_r[i] = t < T ? p.dsum[stat + t] : 0.f;
    for (int c = 0; c < CO; ++c) dq[i][c] = 0.f;
  }

  for (int s0 = kmin; s0 < kend; s0 += BN) {
    __syncthreads();  // the previous tile's readers of k_s, v_s, ds_s are done
    load_tile<HD, BN>(k_s, p.k, b, T, g, s0, kend);
    load_tile<HD, BN>(v_s, p.v, b, T, g, s0, kend);
    __syncthreads();
    float sp[RM][CN], dp[RM][CN];
    tile_dot<HD, RM, CN>(sp, q_s, r0, k_s, tx);
    tile_dot<HD, RM, CN>(dp, do_s, r0, v_s, tx);
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < CN; ++j) {
        const int key = s0 + tx + 8 * j;
        const bool allowed = key >= kb_r[i] && key <= t_r[i];
        const float pv = allowed ? exp2f(sp[i][j] * scale_log2 - lse_r[i]) : 0.f;
        ds_s[(r0 + i) * PS + tx + 8 * j] = allowed ? pv * (dp[i][j] - d_r[i]) : 0.f;
      }
    __syncthreads();
    tile_pv<HD, RM, BN, PS>(dq, ds_s, r0, k_s, tx);
  }

  for (int i = 0; i < RM; ++i)
    if (t_r[i] < T) store_row<HD>(p.dq, b, T, h, t_r[i], dq[i], scale, tx);
}

// ---- host side ----

void check_heads(const char* op, const char* name, const void* ptr, int64_t token_stride, int64_t head_stride) {
  if (!ptr) throw std::invalid_argument(std::string(op) + ": " + name + " is null");
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || token_stride % 8 != 0 || head_stride % 8 != 0)
    throw std::invalid_argument(std::string(op) + ": " + name +
                                " must be 16-byte aligned with token/head strides that are multiples of 8 elements "
                                "(token stride " + std::to_string(token_stride) + ", head stride " +
                                std::to_string(head_stride) + ")");
}

template <class T>
void check_heads(const char* op, const char* name, const AttentionHeads<T>& x) {
  check_heads(op, name, x.ptr, x.token_stride, x.head_stride);
}

// False when there is nothing to do.
bool check_shape(const char* op, const AttentionParams& p) {
  if (p.B < 0 || p.T < 0) throw std::invalid_argument(std::string(op) + ": negative batch or sequence length");
  if (p.KVH <= 0 || p.H <= 0 || p.H % p.KVH != 0)
    throw std::invalid_argument(std::string(op) + ": n_heads " + std::to_string(p.H) +
                                " must be a positive multiple of n_kv_heads " + std::to_string(p.KVH));
  if (p.hd != 16 && p.hd != 32 && p.hd != 64 && p.hd != 128)
    throw std::invalid_argument(std::string(op) + ": head_dim " + std::to_string(p.hd) +
                                " not supported (instantiated: 16, 32, 64, 128)");
  if (p.B > 65535 || p.H > 65535) throw std::invalid_argument(std::string(op) + ": batch or n_heads above 65535");
  return p.B > 0 && p.T > 0;
}

// True when the tensor-core kernels (attention_tc.cu) run this call.
bool use_tensor_cores(const char* op, const AttentionParams& p) {
  if (p.kernel == AttentionKernel::kCudaCores) return false;
  const bool can = attention_tc_supports(p.hd);
  if (p.kernel == AttentionKernel::kTensorCores && !can)
    throw std::invalid_argument(std::string(op) + ": the tensor-core kernels support head_dim 64 and 128, not " +
                                std::to_string(p.hd));
  return can;
}

unsigned tiles(int n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <int HD>
void forward_launch(const AttentionParams& p, cudaStream_t stream) {
  using Tr = AttentionTraits<HD>;
  launch_kernel(attention_forward_kernel<HD>, dim3(tiles(p.T, Tr::kFwdM), p.H, p.B), dim3(AttentionLayout::kThreads), 0,
                stream, p);
}

template <int HD>
void backward_launch(const AttentionParams& p, cudaStream_t stream) {
  using Tr = AttentionTraits<HD>;
  launch_kernel(attention_dkdv_kernel<HD>, dim3(tiles(p.T, Tr::kKvN), p.KVH, p.B), dim3(AttentionLayout::kThreads), 0,
                stream, p);
  launch_kernel(attention_dq_kernel<HD>, dim3(tiles(p.T, Tr::kDqM), p.H, p.B), dim3(AttentionLayout::kThreads), 0,
                stream, p);
}

}  // namespace

void attention_forward_cuda(const AttentionParams& p, cudaStream_t stream) {
  const char* op = "attention_forward_cuda";
  if (!check_shape(op, p)) return;
  check_heads(op, "q", p.q), check_heads(op, "k", p.k), check_heads(op, "v", p.v), check_heads(op, "out", p.out);
  if (!p.lse) throw std::invalid_argument(std::string(op) + ": lse is null");
  if (use_tensor_cores(op, p)) return attention_tc_forward(p, stream);
  switch (p.hd) {
    case 16: return forward_launch<16>(p, stream);
    case 32: return forward_launch<32>(p, stream);
    case 64: return forward_launch<64>(p, stream);
    case 128: return forward_launch<128>(p, stream);
  }
}

void attention_backward_cuda(const AttentionParams& p, cudaStream_t stream) {
  const char* op = "attention_backward_cuda";
  if (!check_shape(op, p)) return;
  check_heads(op, "q", p.q), check_heads(op, "k", p.k), check_heads(op, "v", p.v), check_heads(op, "out", p.out);
  check_heads(op, "dout", p.dout), check_heads(op, "dq", p.dq), check_heads(op, "dk", p.dk),
      check_heads(op, "dv", p.dv);
  if (!p.lse || !p.dsum) throw std::invalid_argument(std::string(op) + ": lse or dsum is null");
  const int64_t n_rows = static_cast<int64_t>(p.B) * p.T * p.H;
  const int64_t n_blocks = (n_rows + AttentionLayout::kDsumRowsPerBlock - 1) / AttentionLayout::kDsumRowsPerBlock;
  if (n_blocks > 0x7fffffff) throw std::invalid_argument(std::string(op) + ": B * T * n_heads too large");
  launch_kernel(attention_dsum_kernel, dim3(static_cast<unsigned>(n_blocks)), dim3(AttentionLayout::kThreads), 0,
                stream, p);
  if (use_tensor_cores(op, p)) return attention_tc_backward(p, stream);
  switch (p.hd) {
    case 16: return backward_launch<16>(p, stream);
    case 32: return backward_launch<32>(p, stream);
    case 64: return backward_launch<64>(p, stream);
    case 128: return backward_launch<128>(p, stream);
  }
}

LT_CUDA_NAMESPACE_END
