// Causal attention on tensor cores (head_dim 64 and 128), FlashAttention-2's algorithm and work
// partitioning (Dao 2023, "FlashAttention-2", sections 3.1-3.3), hand-written on the wrappers of
// tensor_core.cuh. Semantics and formulas: attention.cuh; the CUDA-core kernels of attention.cu
// compute the same results for every head dim and are the fallback.
//
// Forward: one block of 4 warps per (query tile of 128 rows, head, batch row); warp w owns the 32
// query rows 32w..32w+31 of the tile, two 16-row mma tiles (FA2's "split Q": no cross-warp
// reduction of the softmax statistics or of O; two row tiles so that every K or V fragment read
// by ldmatrix feeds four mma, not two: shared-memory traffic per mma, the limit, falls by about a
// third). Per key tile of 64 keys (32 at head_dim 128, for registers and shared memory), every
// warp computes its 32-row slice of S = Q K^T with mma (A = Q by ldmatrix from shared memory, B = K by non-transposed ldmatrix, since
// K stored (key, d) row-major is B^T row-major), applies the causal / example mask, updates the
// running max m and sum l of its rows (exp2 domain), converts P to bf16 in registers -- the mma
// accumulator layout of two adjacent 8-key n-tiles is exactly the A fragment of one 16-key k-step
// -- and accumulates O += P V (B = V by ldmatrix .trans). K/V tiles are double buffered: the
// cp.async copies of tile i + 1 are in flight while tile i is computed.
//
// Shared memory rows (Q, K, V) hold hd bf16 plus 8 padding elements: a row is (hd + 8) * 2 = 144
// or 272 bytes, 16 bytes (4 banks) more than a multiple of 128, so the 8 row addresses of one
// ldmatrix 8x8 matrix fall in 8 distinct 4-bank groups (conflict-free) and every row stays
// 16-byte aligned for cp.async and ldmatrix. The padding is never read.
//
// Masking: query t sees keys kb(t) <= s <= t. A key tile needs the mask only when it reaches past
// the tile's first query or starts before the largest kb of its rows; other tiles skip it
// (block-uniform test). Key tiles start at the smallest kb of the tile's rows and end at its last
// query: tiles above the diagonal or before every row's example start are never loaded.
//
// Fragment names follow the PTX ISA (tensor_core.cuh): lane = groupID * 4 + threadID_in_group
// ("g", "tig" below); accumulator register c0/c1 is row g, cols 2 tig + {0, 1} of its 16x8 tile,
// c2/c3 row g + 8.
#include "attention_tc.cuh"

#include <climits>
#include <cmath>

#include "tensor_core.cuh"

LT_CUDA_NAMESPACE_BEGIN
namespace {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

struct TcLayout {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16;  // rows of one mma A fragment, owned by one warp (backward)
};

// Forward tiles: 128 queries (4 warps x 2 row tiles x 16) x 64 keys per step at hd 64, x 32 keys at
// hd 128. Registers per thread at hd 128: O 32x128 / 32 lanes = 128 fp32, S 32x32 / 32 = 32 fp32;
// shared memory 68 KiB (Q 34 KiB, two K/V buffers 34 KiB): two blocks per SM on an A100 too.
template <int HD>
struct TcForwardTraits {
  static_assert(HD == 64 || HD == 128, "the tensor-core path is instantiated for head_dim 64 and 128");
  static constexpr int kRowTiles = 2;                                 // 16-row mma tiles per warp
  static constexpr int kWarpRows = 16 * kRowTiles;                    // query rows per warp
  static constexpr int kM = TcLayout::kWarps * kWarpRows;             // queries per block
  static constexpr int kN = HD == 128 ? 32 : 64;                      // keys per tile
  static constexpr int kStride = HD + 8;                              // smem row stride (elements)
  static constexpr int kSTiles = kN / 8;                              // 8-key n-tiles of S
  static constexpr int kOTiles = HD / 8;                              // 8-column n-tiles of O
  // Q, then two buffers of (K, V).
  static constexpr int kTileElems = kN * kStride;
  static constexpr size_t kSmemBytes = (static_cast<size_t>(kM) * kStride + 4 * kTileElems) * sizeof(bf16);
};

// First key query t may see: seg_start clamped to [0, t + 1], the rule of the CPU op and of
// attention.cu's key_begin.
__device__ __forceinline__ int key_begin(const int32_t* seg_start, int b, int T, int t) {
  if (!seg_start) return 0;
  const int s = seg_start[static_cast<int64_t>(b) * T + t];
  return imin(imax(s, 0), t + 1);
}

// Smallest and largest key_begin over rows [q0, q0 + rows) (rows past T count as INT_MAX: nothing
// allowed), the same in every lane of every warp: each warp reads them all and reduces by shuffles,
// so no shared memory or barrier is needed and branches on the result are block-uniform.
struct KeyRange {
  int min_begin, max_begin;
};
__device__ __forceinline__ KeyRange tile_key_range(const int32_t* seg_start, int b, int T, int q0, int rows) {
  int lo = INT_MAX, hi = 0;
  for (int r = threadIdx.x % 32; r < rows; r += 32) {
    const int t = q0 + r;
    const int kb = t < T ? key_begin(seg_start, b, T, t) : INT_MAX;
    lo = imin(lo, kb), hi = imax(hi, kb);
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = imin(lo, __shfl_xor_sync(kFullMask, lo, o));
    hi = imax(hi, __shfl_xor_sync(kFullMask, hi, o));
  }
  return {lo, hi};
}

// The launch order of the causal passes (FlashAttention-2's): the grid is (heads, batch rows,
// tiles), the tile slowest, so blocks are dispatched tile by tile over every head and batch row,
// and the tiles with the most key (or query) tiles to visit go first; the short ones fill the SMs
// at the end instead of a few long ones running alone (causal_grid). Query tile z of the forward
// and dQ passes is the z-th longest: the last one first.
__device__ __forceinline__ int query_tile_longest_first() { return static_cast<int>(gridDim.z - 1 - blockIdx.z); }

// Element (row, col) offset of head `head` of token t of batch row b.
template <class T>
__device__ __forceinline__ int64_t head_offset(const AttentionHeads<T>& x, int b, int T_, int t, int head) {
  return (static_cast<int64_t>(b) * T_ + t) * x.token_stride + static_cast<int64_t>(head) * x.head_stride;
}

// cp.async of rows [row0, row0 + ROWS) of head `head` into a (ROWS, HD + 8) smem tile, 16 bytes per
// copy; rows at or past row_end are zero-filled (src-size 0: nothing is read, so the tensor's first
// element stands in as the source address). Zero rows keep masked products finite (0 * V = 0).
template <int HD, int ROWS>
__device__ __forceinline__ void cp_async_rows(bf16* dst, const AttentionHeads<const bf16>& x, int b, int T, int head,
                                              int row0, int row_end) {
  constexpr int kChunks = HD / 8, kStride = HD + 8;
  for (int i = threadIdx.x; i < ROWS * kChunks; i += TcLayout::kThreads) {
    const int r = i / kChunks, c = i - r * kChunks, t = row0 + r;
    const bool in = t < row_end;
    const bf16* src = x.ptr + (in ? head_offset(x, b, T, t, head) + c * 8 : 0);
    tc::cp_async_16_zfill(dst + r * kStride + c * 8, src, in ? 16 : 0);
  }
}

__device__ __forceinline__ uint32_t pack_f32_bf16x2(float lo, float hi) {
  return tc::pack_bf16x2(__float2bfloat16(lo), __float2bfloat16(hi));
}

// acc (16 x 8 NT, fp32 mma accumulators) = A (16 x 16 KSTEPS, smem rows a_row0.., row-major) *
// B^T where B^T (8 NT x 16 KSTEPS) is row-major in smem from row b_row0 (K stored (key, d)).
// A fragment: ldmatrix_x4, lane l points at row l % 16, col 8 (l / 16) of the 16x16 block
// (matrices: rows 0-7 / 8-15 x cols 0-7, then cols 8-15 = a[0..3]). B fragments of two n-tiles:
// ldmatrix_x4 (no .trans), lane l at row (l % 8) + 8 (l / 16), col 8 ((l / 8) % 2): matrix 0 =
// keys 0-7 x k 0-7 (b[0] of n-tile j), 1 = keys 0-7 x k 8-15 (b[1]), 2 and 3 the same for keys 8-15
// (n-tile j + 1). Without .trans a lane gets row g, cols 2 tig + {0,1} of each matrix, i.e. key g,
// k 2 tig + {0,1}: the B layout (rows k = 2 tig + {0,1}, col n = g).
// With RT row tiles (rows a_row0 + 16 rt.., acc[rt]), each B fragment feeds 2 RT mma.
template <int RT, int NT, int KSTEPS, int STRIDE>
__device__ __forceinline__ void mma_a_bt_rows(float (&acc)[RT][NT][4], const bf16* a_s, int a_row0, const bf16* bt_s,
                                              int b_row0) {
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
  const int lane = threadIdx.x % 32;
  for (int rt = 0; rt < RT; ++rt)
    for (int j = 0; j < NT; ++j)
      for (int e = 0; e < 4; ++e) acc[rt][j][e] = 0.f;
  const auto k_step = [&](int ks) {
    uint32_t a[RT][4];
    for (int rt = 0; rt < RT; ++rt)
      tc::ldmatrix_x4(a[rt], a_s + (a_row0 + 16 * rt + lane % 16) * STRIDE + 16 * ks + 8 * (lane / 16));
    for (int j = 0; j < NT; j += 2) {
      uint32_t b[4];
      tc::ldmatrix_x4(b, bt_s + (b_row0 + 8 * j + lane % 8 + 8 * (lane / 16)) * STRIDE + 16 * ks + 8 * ((lane / 8) % 2));
      for (int rt = 0; rt < RT; ++rt) {
        tc::mma_m16n8k16_bf16_f32(acc[rt][j], a[rt], &b[0], acc[rt][j]);
        tc::mma_m16n8k16_bf16_f32(acc[rt][j + 1], a[rt], &b[2], acc[rt][j + 1]);
      }
    }
  };
  if constexpr (RT == 1) {
    for (int ks = 0; ks < KSTEPS; ++ks) k_step(ks);
  } else {
    // Two row tiles beside the forward's O (128 registers at hd 128): with the k-steps unrolled the
    // scheduler hoisted their fragments and spilled; rolled, 251 registers and no spill (sm_90).
    LT_NO_UNROLL
    for (int ks = 0; ks < KSTEPS; ++ks) k_step(ks);
  }
}
// One row tile (the backward's warps own 16 rows).
template <int NT, int KSTEPS, int STRIDE>
__device__ __forceinline__ void mma_a_bt(float (&acc)[NT][4], const bf16* a_s, int a_row0, const bf16* bt_s,
                                         int b_row0) {
  mma_a_bt_rows<1, NT, KSTEPS, STRIDE>(reinterpret_cast<float(&)[1][NT][4]>(acc), a_s, a_row0, bt_s, b_row0);
}

// acc (16 x 8 NT) += P (16 x 16 KSTEPS, registers: the fp32 accumulators p of 2 KSTEPS 8-wide
// n-tiles) * B (16 KSTEPS x 8 NT, row-major in smem from row b_row0, e.g. V stored (key, d)).
// A from accumulators: the A fragment of k-step kk is {p[2kk] c0c1, p[2kk] c2c3, p[2kk+1] c0c1,
// p[2kk+1] c2c3} (a[0]: row g cols 2 tig + {0,1}; a[1]: row g + 8; a[2], a[3]: cols + 8), rounded
// to bf16. B fragments of two n-tiles: ldmatrix_x4_trans, lane l at row (l % 16), col 8 (l / 16):
// matrices k 0-7 / 8-15 of cols 0-7 (b[0], b[1] of n-tile j), then of cols 8-15 (n-tile j + 1).
// The A fragments of P (RT row tiles of 16 x 16 KSTEPS fp32 accumulators, 2 KSTEPS 8-wide n-tiles
// each) as bf16: the fragment of k-step kk is {p[2kk] c0c1, p[2kk] c2c3, p[2kk+1] c0c1, p[2kk+1]
// c2c3}. Packed before the products so that the fp32 values die first (registers: the forward's
// O and P at hd 128 take 128 + 16 of them).
template <int RT, int KSTEPS>
__device__ __forceinline__ void pack_p_rows(uint32_t (&a)[RT][KSTEPS][4], const float (&p)[RT][2 * KSTEPS][4]) {
  for (int rt = 0; rt < RT; ++rt)
    for (int kk = 0; kk < KSTEPS; ++kk) {
      a[rt][kk][0] = pack_f32_bf16x2(p[rt][2 * kk][0], p[rt][2 * kk][1]);
      a[rt][kk][1] = pack_f32_bf16x2(p[rt][2 * kk][2], p[rt][2 * kk][3]);
      a[rt][kk][2] = pack_f32_bf16x2(p[rt][2 * kk + 1][0], p[rt][2 * kk + 1][1]);
      a[rt][kk][3] = pack_f32_bf16x2(p[rt][2 * kk + 1][2], p[rt][2 * kk + 1][3]);
    }
}

// With RT row tiles (p[rt] -> acc[rt]), each B fragment feeds 2 RT mma.
template <int RT, int NT, int KSTEPS, int STRIDE>
__device__ __forceinline__ void mma_p_b_rows(float (&acc)[RT][NT][4], const float (&p)[RT][2 * KSTEPS][4],
                                             const bf16* b_s, int b_row0) {
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
  const int lane = threadIdx.x % 32;
  uint32_t a[RT][KSTEPS][4];
  pack_p_rows<RT, KSTEPS>(a, p);
  for (int kk = 0; kk < KSTEPS; ++kk)
    for (int j = 0; j < NT; j += 2) {
      uint32_t b[4];
      tc::ldmatrix_x4_trans(b, b_s + (b_row0 + 16 * kk + lane % 16) * STRIDE + 8 * j + 8 * (lane / 16));
      for (int rt = 0; rt < RT; ++rt) {
        tc::mma_m16n8k16_bf16_f32(acc[rt][j], a[rt][kk], &b[0], acc[rt][j]);
        tc::mma_m16n8k16_bf16_f32(acc[rt][j + 1], a[rt][kk], &b[2], acc[rt][j + 1]);
      }
    }
}
// One row tile (the backward's warps own 16 rows).
template <int NT, int KSTEPS, int STRIDE>
__device__ __forceinline__ void mma_p_b(float (&acc)[NT][4], const float (&p)[2 * KSTEPS][4], const bf16* b_s,
                                        int b_row0) {
  mma_p_b_rows<1, NT, KSTEPS, STRIDE>(reinterpret_cast<float(&)[1][NT][4]>(acc),
                                      reinterpret_cast<const float(&)[1][2 * KSTEPS][4]>(p), b_s, b_row0);
}

// The running softmax of the forward for this thread's two rows (r = 0: row g, r = 1: row g + 8).
// m in the exp2 domain (scores times log2(e) / sqrt(hd)); l is this thread's partial sum over its
// own columns (the 4 lanes of a row share m and add their l once at the end).
struct OnlineSoftmax {
  float m[2], l[2];
};

// Masks and scales the score tile s (16 x 8 NT) of keys s0.., updates m and l, turns s into
// P = exp2(s - m) and returns the factors exp2(m_old - m_new) that rescale O, per row.
template <int NT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], OnlineSoftmax& st, float (&corr)[2], int s0,
                                             bool masked, const int (&kb)[2], const int (&tq)[2], float scale_log2) {
  const int tig = threadIdx.x % 4;
  for (int r = 0; r < 2; ++r) {
    float mt = -INFINITY;
    for (int j = 0; j < NT; ++j)
      for (int e = 0; e < 2; ++e) {
        const int key = s0 + 8 * j + 2 * tig + e;
        float v = s[j][2 * r + e] * scale_log2;
        if (masked && !(key >= kb[r] && key <= tq[r])) v = -INFINITY;
        s[j][2 * r + e] = v;
        mt = fmaxf(mt, v);
      }
    mt = fmaxf(mt, __shfl_xor_sync(kFullMask, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(kFullMask, mt, 2));
    const float mn = fmaxf(st.m[r], mt);
    const float mu = mn == -INFINITY ? 0.f : mn;  // no allowed key yet: keep exp2 away from -inf - -inf
    corr[r] = exp2f(st.m[r] - mu);
    st.m[r] = mn;
    float ls = 0.f;
    for (int j = 0; j < NT; ++j)
      for (int e = 0; e < 2; ++e) {
        const float pv = exp2f(s[j][2 * r + e] - mu);
        s[j][2 * r + e] = pv;
        ls += pv;
      }
    st.l[r] = st.l[r] * corr[r] + ls;
  }
}

// Rows of head `head` of y from the 16-row accumulators of one warp (rows tq[0], tq[1] of this
// thread) times mul[r], as bf16 pairs; rows at or past T are not written.
template <int NT>
__device__ __forceinline__ void store_rows(const AttentionHeads<bf16>& y, int b, int T, int head, const int (&tq)[2],
                                           const float (&acc)[NT][4], const float (&mul)[2]) {
  const int tig = threadIdx.x % 4;
  for (int r = 0; r < 2; ++r) {
    if (tq[r] >= T) continue;
    bf16* row = y.ptr + head_offset(y, b, T, tq[r], head);
    for (int j = 0; j < NT; ++j)
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * j + 2 * tig) =
          __floats2bfloat162_rn(acc[j][2 * r] * mul[r], acc[j][2 * r + 1] * mul[r]);
  }
}

template <int HD>
__global__ void __launch_bounds__(TcLayout::kThreads) attention_tc_forward_kernel(AttentionParams p) {
  using Tr = TcForwardTraits<HD>;
  constexpr int kM = Tr::kM, kN = Tr::kN, kStride = Tr::kStride, kRT = Tr::kRowTiles;
  LT_DYNAMIC_SMEM(bf16, smem);
  bf16* q_s = smem;                               // (kM, kStride)
  bf16* kv_s = smem + kM * kStride;               // buffer i: K at 2i, V at 2i + 1 (kN, kStride) each
  const int T = p.T, q0 = query_tile_longest_first() * kM, h = blockIdx.x, b = blockIdx.y, g = h / (p.H / p.KVH);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wrow = warp * Tr::kWarpRows;  // the warp's first row in the tile
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HD));

  const KeyRange range = tile_key_range(p.seg_start, b, T, q0, kM);
  const int kend = imin(q0 + kM, T);  // one past the tile's last query (and last key it may see)
  const int n_tiles = range.min_begin < kend ? (kend - range.min_begin + kN - 1) / kN : 0;
  // This thread's rows: row tile rt, r = 0 (row g) and 1 (row g + 8).
  int tq[kRT][2], kb[kRT][2];
  OnlineSoftmax st[kRT];
  for (int rt = 0; rt < kRT; ++rt) {
    for (int r = 0; r < 2; ++r) {
      tq[rt][r] = q0 + wrow + 16 * rt + lane / 4 + 8 * r;
      kb[rt][r] = tq[rt][r] < T ? key_begin(p.seg_start, b, T, tq[rt][r]) : INT_MAX;
    }
    st[rt] = OnlineSoftmax{{-INFINITY, -INFINITY}, {0.f, 0.f}};
  }
  float o[kRT][Tr::kOTiles][4];
  for (int rt = 0; rt < kRT; ++rt)
    for (int j = 0; j < Tr::kOTiles; ++j)
      for (int e = 0; e < 4; ++e) o[rt][j][e] = 0.f;

  if (n_tiles > 0) {
    cp_async_rows<HD, kM>(q_s, p.q, b, T, h, q0, T);
    cp_async_rows<HD, kN>(kv_s, p.k, b, T, g, range.min_begin, kend);
    cp_async_rows<HD, kN>(kv_s + Tr::kTileElems, p.v, b, T, g, range.min_begin, kend);
    tc::cp_async_commit();
  }
  for (int i = 0; i < n_tiles; ++i) {
    const int s0 = range.min_begin + i * kN;
    if (i + 1 < n_tiles) {  // prefetch tile i + 1 into the other buffer
      bf16* next = kv_s + 2 * ((i + 1) % 2) * Tr::kTileElems;
      cp_async_rows<HD, kN>(next, p.k, b, T, g, s0 + kN, kend);
      cp_async_rows<HD, kN>(next + Tr::kTileElems, p.v, b, T, g, s0 + kN, kend);
    }
    tc::cp_async_commit();  // possibly empty: the wait below then still retires tile i's group
    tc::cp_async_wait<1>();
    __syncthreads();  // tile i (and Q) copied by every thread
    const bf16* k_s = kv_s + 2 * (i % 2) * Tr::kTileElems;
    float s[kRT][Tr::kSTiles][4];
    mma_a_bt_rows<kRT, Tr::kSTiles, HD / 16, kStride>(s, q_s, wrow, k_s, 0);
    // Keys past the diagonal of the tile's first query, or before some row's example start.
    const bool masked = s0 + kN - 1 > q0 || s0 < range.max_begin;
    for (int rt = 0; rt < kRT; ++rt) {
      float corr[2];
      softmax_step<Tr::kSTiles>(s[rt], st[rt], corr, s0, masked, kb[rt], tq[rt], scale_log2);
      for (int j = 0; j < Tr::kOTiles; ++j)
        for (int e = 0; e < 4; ++e) o[rt][j][e] *= corr[e / 2];
    }
    mma_p_b_rows<kRT, Tr::kOTiles, kN / 16, kStride>(o, s, k_s + Tr::kTileElems, 0);
    __syncthreads();  // every warp is done with buffer i % 2 before iteration i + 1 refills it
  }

  for (int rt = 0; rt < kRT; ++rt) {
    float inv[2];
    for (int r = 0; r < 2; ++r) {
      float l = st[rt].l[r];
      l += __shfl_xor_sync(kFullMask, l, 1);
      l += __shfl_xor_sync(kFullMask, l, 2);
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      if (lane % 4 == 0 && tq[rt][r] < T)
        p.lse[(static_cast<int64_t>(b) * p.H + h) * T + tq[rt][r]] = l > 0.f ? (st[rt].m[r] + log2f(l)) * kLn2 : -INFINITY;
    }
    store_rows<Tr::kOTiles>(p.out, b, T, h, tq[rt], o[rt], inv);
  }
}

// ---- backward ------------------------------------------------------------------------------------
// FA2's backward without atomics: D = rowsum(dO O) (attention.cu's dsum kernel), then two passes
// that each own their outputs, so every element is summed by one thread in a fixed order
// (deterministic):
// * dK/dV: one block per (key tile of 64, KV head, batch row); warp w owns keys 16w..16w+15 and
//   loops over the heads of the GQA group and the query tiles that can see the key tile. Per
//   query tile: S^T = K Q^T and dP^T = V dO^T (A = K, V from shared memory; B = Q, dO by
//   non-transposed ldmatrix), P^T = exp2(S^T log2e/sqrt(hd) - lse log2e), dS^T = P^T (dP^T - D),
//   then dV += P^T dO and dK += dS^T Q with P^T, dS^T as bf16 A fragments straight from the
//   accumulators (B = dO, Q by ldmatrix .trans). Q/dO tiles and their lse, D, key_begin values are
//   double buffered (cp.async for the tiles, plain stores for the 3 x kM statistics).
// * dQ: one block per (query tile of 64, head, batch row), warp w owns 16 query rows and loops over
//   the key tiles as the forward does (K/V double buffered): S = Q K^T, dP = dO V^T, dS as above,
//   dQ += dS K (B = K by ldmatrix .trans).
// Tiles: dK/dV 64 keys x 64 queries per step at hd 64, 64 x 32 at hd 128 (registers per thread:
// dK and dV 2 x 64 fp32 + S^T, dP^T 2 x 16); dQ 64 x 64 (dQ 64 + S, dP 2 x 32 at hd 128).
template <int HD>
struct TcBackwardTraits {
  static_assert(HD == 64 || HD == 128, "the tensor-core path is instantiated for head_dim 64 and 128");
  static constexpr int kStride = HD + 8;
  static constexpr int kDTiles = HD / 8;  // 8-column n-tiles of dQ, dK, dV
  // dK/dV pass.
  static constexpr int kKvN = TcLayout::kWarps * TcLayout::kWarpRows;  // keys per block
  static constexpr int kKvM = HD == 128 ? 32 : 64;                      // queries per step
  static constexpr size_t kKvSmemBytes =
      (static_cast<size_t>(2 * kKvN + 4 * kKvM) * kStride) * sizeof(bf16) + 2 * 3 * kKvM * sizeof(float);
  // dQ pass.
  static constexpr int kDqM = TcLayout::kWarps * TcLayout::kWarpRows;  // queries per block
  static constexpr int kDqN = 64;                                       // keys per step
  static constexpr size_t kDqSmemBytes = (static_cast<size_t>(2 * kDqM + 4 * kDqN) * kStride) * sizeof(bf16);
};

// One query tile of the dK/dV pass: head h, queries q0..; done when h reaches the group's end.
struct QueryStep {
  int h, q0;
  bool masked;
};

// The first query tile at or after (h, q0) that can see a key of [s0, kend): some row's key_begin
// is below kend (rows from q0 >= s0 on are all at or past the tile's first key). The block-uniform
// masked flag: some (key, query) pair of the step is not allowed (a key past a query, or a query
// whose example starts after the tile's first key).
template <int KM, int KN>
__device__ __forceinline__ QueryStep find_query_step(const AttentionParams& p, int b, int h, int q0, int h_end, int s0,
                                                     int kend) {
  for (; h < h_end; ++h, q0 = s0)
    for (; q0 < p.T; q0 += KM) {
      const KeyRange r = tile_key_range(p.seg_start, b, p.T, q0, KM);
      if (r.min_begin < kend) return {h, q0, q0 < s0 + KN - 1 || r.max_begin > s0};
    }
  return {h_end, 0, false};
}

// Statistics of the rows of a query tile for the backward, in exp2 terms: lse * log2(e), D, and
// key_begin (INT_MAX past T: nothing allowed), written by threads 0..KM-1 with plain stores.
template <int KM>
__device__ __forceinline__ void store_row_stats(float* lse_s, float* d_s, int* kb_s, const AttentionParams& p, int b,
                                                int h, int q0) {
  const int i = threadIdx.x;
  if (i >= KM) return;
  const int t = q0 + i;
  const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * p.T + t;
  const bool in = t < p.T;
  lse_s[i] = in ? p.lse[stat] * kLog2e : 0.f;
  d_s[i] = in ? p.dsum[stat] : 0.f;
  kb_s[i] = in ? key_begin(p.seg_start, b, p.T, t) : INT_MAX;
}

// P and dS (in place of s and dp) of a 16 x 8 NT tile in accumulator layout. Rows and columns name
// keys and queries through key_of / query_of (the dK/dV pass works on the transposes); lse2 and d
// are the query's statistics, allowed the mask.
template <int NT, class Stats>
__device__ __forceinline__ void backward_p_ds(float (&s)[NT][4], float (&dp)[NT][4], bool masked, float scale_log2,
                                              const Stats& stats) {
  const int g = (threadIdx.x % 32) / 4, tig = threadIdx.x % 4;
  for (int j = 0; j < NT; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 8 * j + 2 * tig + e % 2;
      float lse2, d;
      const bool allowed = stats(row, col, masked, lse2, d);
      const float pv = allowed ? exp2f(s[j][e] * scale_log2 - lse2) : 0.f;
      s[j][e] = pv;
      dp[j][e] = allowed ? pv * (dp[j][e] - d) : 0.f;
    }
}

template <int HD>
__global__ void __launch_bounds__(TcLayout::kThreads) attention_tc_dkdv_kernel(AttentionParams p) {
  using Tr = TcBackwardTraits<HD>;
  constexpr int kN = Tr::kKvN, kM = Tr::kKvM, kStride = Tr::kStride;
  LT_DYNAMIC_SMEM(bf16, smem);
  bf16* k_s = smem;                        // (kN, kStride)
  bf16* v_s = k_s + kN * kStride;          // (kN, kStride)
  bf16* qdo_s = v_s + kN * kStride;        // buffer i: Q at 2i, dO at 2i + 1 (kM, kStride) each
  float* stat_s = reinterpret_cast<float*>(qdo_s + 4 * kM * kStride);  // buffer i: lse2, D, kb at 3i..
  // Key tile z sees the queries from z on: the first key tiles have the most work (causal_grid).
  const int T = p.T, s0 = blockIdx.z * kN, g = blockIdx.x, b = blockIdx.y, group = p.H / p.KVH;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wrow = warp * TcLayout::kWarpRows;
  const float scale = 1.f / sqrtf(static_cast<float>(HD)), scale_log2 = kLog2e * scale;
  const int kend = imin(s0 + kN, T), h_end = (g + 1) * group;

  float dk[Tr::kDTiles][4], dv[Tr::kDTiles][4];
  for (int j = 0; j < Tr::kDTiles; ++j)
    for (int e = 0; e < 4; ++e) dk[j][e] = 0.f, dv[j][e] = 0.f;
  const auto stats_of = [&](int buf) { return stat_s + 3 * kM * buf; };
  const auto issue = [&](const QueryStep& st, int buf) {
    bf16* q_dst = qdo_s + 2 * buf * kM * kStride;
    cp_async_rows<HD, kM>(q_dst, p.q, b, T, st.h, st.q0, T);
    cp_async_rows<HD, kM>(q_dst + kM * kStride, p.dout, b, T, st.h, st.q0, T);
    float* f = stats_of(buf);
    store_row_stats<kM>(f, f + kM, reinterpret_cast<int*>(f + 2 * kM), p, b, st.h, st.q0);
  };

  QueryStep cur = find_query_step<kM, kN>(p, b, g * group, s0, h_end, s0, kend);
  if (cur.h < h_end) {
    cp_async_rows<HD, kN>(k_s, p.k, b, T, g, s0, kend);
    cp_async_rows<HD, kN>(v_s, p.v, b, T, g, s0, kend);
    issue(cur, 0);
    tc::cp_async_commit();
  }
  for (int i = 0; cur.h < h_end; ++i) {
    const QueryStep next = find_query_step<kM, kN>(p, b, cur.h, cur.q0 + kM, h_end, s0, kend);
    if (next.h < h_end) issue(next, (i + 1) % 2);
    tc::cp_async_commit();
    tc::cp_async_wait<1>();
    __syncthreads();  // step i's tiles (and K, V) copied, its statistics stored, by every thread
    const bf16* q_s = qdo_s + 2 * (i % 2) * kM * kStride;
    const bf16* do_s = q_s + kM * kStride;
    const float* lse_s = stats_of(i % 2);
    const float* d_s = lse_s + kM;
    const int* kb_s = reinterpret_cast<const int*>(lse_s + 2 * kM);
    float st[kM / 8][4], dpt[kM / 8][4];
    mma_a_bt<kM / 8, HD / 16, kStride>(st, k_s, wrow, q_s, 0);   // S^T (keys, queries), unscaled
    mma_a_bt<kM / 8, HD / 16, kStride>(dpt, v_s, wrow, do_s, 0); // dP^T = V dO^T
    const int key0 = s0 + wrow, q0 = cur.q0;
    backward_p_ds<kM / 8>(st, dpt, cur.masked, scale_log2, [&](int row, int col, bool masked, float& lse2, float& d) {
      lse2 = lse_s[col], d = d_s[col];
      const int key = key0 + row;
      return !masked || (key >= kb_s[col] && key <= q0 + col);
    });
    mma_p_b<Tr::kDTiles, kM / 16, kStride>(dv, st, do_s, 0);   // dV += P^T dO
    mma_p_b<Tr::kDTiles, kM / 16, kStride>(dk, dpt, q_s, 0);   // dK += dS^T Q
    __syncthreads();  // every warp is done with buffer i % 2 before step i + 1 refills it
    cur = next;
  }

  const int tk[2] = {s0 + wrow + lane / 4, s0 + wrow + lane / 4 + 8};
  const float mul_k[2] = {scale, scale}, mul_v[2] = {1.f, 1.f};
  store_rows<Tr::kDTiles>(p.dk, b, T, g, tk, dk, mul_k);
  store_rows<Tr::kDTiles>(p.dv, b, T, g, tk, dv, mul_v);
}

template <int HD>
__global__ void __launch_bounds__(TcLayout::kThreads) attention_tc_dq_kernel(AttentionParams p) {
  using Tr = TcBackwardTraits<HD>;
  constexpr int kM = Tr::kDqM, kN = Tr::kDqN, kStride = Tr::kStride, kTileElems = kN * kStride;
  LT_DYNAMIC_SMEM(bf16, smem);
  bf16* q_s = smem;                  // (kM, kStride)
  bf16* do_s = q_s + kM * kStride;   // (kM, kStride)
  bf16* kv_s = do_s + kM * kStride;  // buffer i: K at 2i, V at 2i + 1 (kN, kStride) each
  const int T = p.T, q0 = query_tile_longest_first() * kM, h = blockIdx.x, b = blockIdx.y, g = h / (p.H / p.KVH);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wrow = warp * TcLayout::kWarpRows;
  const float scale = 1.f / sqrtf(static_cast<float>(HD)), scale_log2 = kLog2e * scale;

  const KeyRange range = tile_key_range(p.seg_start, b, T, q0, kM);
  const int kend = imin(q0 + kM, T);
  const int n_tiles = range.min_begin < kend ? (kend - range.min_begin + kN - 1) / kN : 0;
  int tq[2], kb[2];
  float lse2[2], dsum[2];
  for (int r = 0; r < 2; ++r) {
    tq[r] = q0 + wrow + lane / 4 + 8 * r;
    const bool in = tq[r] < T;
    const int64_t stat = (static_cast<int64_t>(b) * p.H + h) * T + tq[r];
    kb[r] = in ? key_begin(p.seg_start, b, T, tq[r]) : INT_MAX;
    lse2[r] = in ? p.lse[stat] * kLog2e : 0.f;
    dsum[r] = in ? p.dsum[stat] : 0.f;
  }
  float dq[Tr::kDTiles][4];
  for (int j = 0; j < Tr::kDTiles; ++j)
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;

  if (n_tiles > 0) {
    cp_async_rows<HD, kM>(q_s, p.q, b, T, h, q0, T);
    cp_async_rows<HD, kM>(do_s, p.dout, b, T, h, q0, T);
    cp_async_rows<HD, kN>(kv_s, p.k, b, T, g, range.min_begin, kend);
    cp_async_rows<HD, kN>(kv_s + kTileElems, p.v, b, T, g, range.min_begin, kend);
    tc::cp_async_commit();
  }
  for (int i = 0; i < n_tiles; ++i) {
    const int s0 = range.min_begin + i * kN;
    if (i + 1 < n_tiles) {
      bf16* next = kv_s + 2 * ((i + 1) % 2) * kTileElems;
      cp_async_rows<HD, kN>(next, p.k, b, T, g, s0 + kN, kend);
      cp_async_rows<HD, kN>(next + kTileElems, p.v, b, T, g, s0 + kN, kend);
    }
    tc::cp_async_commit();
    tc::cp_async_wait<1>();
    __syncthreads();  // tile i (and Q, dO) copied by every thread
    const bf16* k_s = kv_s + 2 * (i % 2) * kTileElems;
    float s[kN / 8][4], dp[kN / 8][4];
    mma_a_bt<kN / 8, HD / 16, kStride>(s, q_s, wrow, k_s, 0);
    mma_a_bt<kN / 8, HD / 16, kStride>(dp, do_s, wrow, k_s + kTileElems, 0);
    const bool masked = s0 + kN - 1 > q0 || s0 < range.max_begin;
    backward_p_ds<kN / 8>(s, dp, masked, scale_log2, [&](int row, int col, bool m, float& l2, float& d) {
      const int r = row / 8, key = s0 + col;
      l2 = lse2[r], d = dsum[r];
      return !m || (key >= kb[r] && key <= tq[r]);
    });
    mma_p_b<Tr::kDTiles, kN / 16, kStride>(dq, dp, k_s, 0);  // dQ += dS K
    __syncthreads();  // every warp is done with buffer i % 2 before iteration i + 1 refills it
  }
  const float mul[2] = {scale, scale};
  store_rows<Tr::kDTiles>(p.dq, b, T, h, tq, dq, mul);
}

// Dynamic shared memory above 48 KiB needs the kernel's opt-in, a property of the kernel in this
// process (one device per process, DESIGN.md): the launchers set it once per kernel.
template <class Kernel>
void opt_in_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) set_max_dynamic_smem(kernel, bytes);
}

unsigned tiles(int n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

// (heads, batch rows, tiles of `tile` positions): query_tile_longest_first.
dim3 causal_grid(int T, int tile, int heads, int B) {
  return dim3(static_cast<unsigned>(heads), static_cast<unsigned>(B), tiles(T, tile));
}

template <int HD>
void forward_launch(const AttentionParams& p, cudaStream_t stream) {
  using Tr = TcForwardTraits<HD>;
  static const bool opted_in = (opt_in_smem(attention_tc_forward_kernel<HD>, Tr::kSmemBytes), true);
  (void)opted_in;
  launch_kernel(attention_tc_forward_kernel<HD>, causal_grid(p.T, Tr::kM, p.H, p.B), dim3(TcLayout::kThreads),
                Tr::kSmemBytes, stream, p);
}

template <int HD>
void backward_launch(const AttentionParams& p, cudaStream_t stream) {
  using Tr = TcBackwardTraits<HD>;
  static const bool opted_in = (opt_in_smem(attention_tc_dkdv_kernel<HD>, Tr::kKvSmemBytes),
                                 opt_in_smem(attention_tc_dq_kernel<HD>, Tr::kDqSmemBytes), true);
  (void)opted_in;
  launch_kernel(attention_tc_dkdv_kernel<HD>, causal_grid(p.T, Tr::kKvN, p.KVH, p.B), dim3(TcLayout::kThreads),
                Tr::kKvSmemBytes, stream, p);
  launch_kernel(attention_tc_dq_kernel<HD>, causal_grid(p.T, Tr::kDqM, p.H, p.B), dim3(TcLayout::kThreads),
                Tr::kDqSmemBytes, stream, p);
}

}  // namespace

void attention_tc_forward(const AttentionParams& p, cudaStream_t stream) {
  if (p.hd == 64) return forward_launch<64>(p, stream);
  if (p.hd == 128) return forward_launch<128>(p, stream);
}

void attention_tc_backward(const AttentionParams& p, cudaStream_t stream) {
  if (p.hd == 64) return backward_launch<64>(p, stream);
  if (p.hd == 128) return backward_launch<128>(p, stream);
}

LT_CUDA_NAMESPACE_END
