// Each kernel's cases written once (issue 34, point 7, as ggml's test-backend-ops): the shapes and
// the seeds that the simulator's tests (tests/sim/test_*_sim.cpp) and the device program's checks
// (tests/gpu/kernel_checks.cu, run on a GPU by scripts/gpu-check.sh and in CI on the simulator by
// GpuCheck.rehearsal) both run, so a first GPU run checks exactly the cases CI checks. Both judge
// them by the same rules (sim_test_util.h: the worst element against fp64 within 2x the naive bf16
// computation's, finite values, untouched padding). `large` cases (Llama-2-7b-sized rows, heads and
// vocabularies) run in the device program only: on the simulator in the rehearsal, not again in
// each of the simulator tests' orders and sanitizer builds.
// Attention's inputs and views are made alike too: tests/sim/attention_test_util.h's Case, used by
// both. (The tensor-core fragment tests, tests/sim/test_tensor_core_sim.cpp, check the simulator's
// emulation of the PTX instructions; on a GPU those are the hardware's, checked through attention.)
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace lt::kernelcases {

struct Rmsnorm {
  int N, C;
  bool large = false;
  unsigned seed(unsigned salt) const { return 1000003u * unsigned(N) + 7919u * unsigned(C) + salt; }
};
inline const Rmsnorm kRmsnorm[] = {{3, 64}, {5, 100}, {4, 288}, {2, 4096}, {70, 33}, {1, 1}, {64, 4096, true}};

// N = 21 is B*T = 3x7; F = 20000 needs more column chunks than the grid has (the stride loop).
struct Swiglu {
  int N, F;
  bool large = false;
  unsigned seed(unsigned salt) const { return 1000003u * unsigned(N) + 7919u * unsigned(F) + salt; }
};
inline const Swiglu kSwiglu[] = {{21, 64}, {5, 100}, {4, 288}, {2, 4096}, {70, 33}, {1, 1}, {3, 20000}, {16, 11008, true}};

// N tokens of a V x C table. Small V forces repeated ids; C = 300 needs 3 column chunks, C = 9000
// more than the grid has.
struct Embedding {
  int N, V, C;
  bool large = false;
  unsigned seed(unsigned salt) const {
    return 1000003u * unsigned(N) + 7919u * unsigned(C) + 31u * unsigned(V) + salt;
  }
};
inline const Embedding kEmbedding[] = {{37, 11, 100}, {64, 1000, 64}, {1, 1, 1},   {200, 50, 33},
                                       {5, 7, 300},   {3, 4, 9000},   {129, 3, 31}, {300, 32000, 512, true}};

// N rows of V logits: scale > 0 normal(0, scale), < 0 uniform(-|scale|, |scale|) (large logits);
// use_mask: a loss mask with weights (the tests' Case).
struct Crossentropy {
  int N, V;
  float scale;
  bool use_mask;
  bool large = false;
  unsigned seed(unsigned salt) const {
    return 1000003u * unsigned(N) + 7919u * unsigned(V) + 131u * unsigned(scale < 0 ? -scale : scale) + salt;
  }
};
inline const Crossentropy kCrossentropy[] = {
    {3, 1, 2.f, true},      {4, 33, 2.f, true},      {3, 512, 3.f, true},    {5, 1000, 2.f, false},
    {3, 32000, 2.f, true},  {4, 257, -80.f, true},   {3, 32000, -80.f, true}, {6, 1000, -80.f, false},
    {64, 32000, 2.f, true, true}};

// RoPE over B rows of T tokens: Hq query and Hk key heads (Hk = 0: q only) of hd elements, head_pad
// elements between heads (not 16-byte multiples: RoPE needs no alignment). Positions: null (p = t),
// or per row packed examples restarting at 0, optionally offset by 3000..9000 (angles where fp32
// angle rounding shows). In place or into another buffer.
enum class RopePositions { kNull, kPacked, kPackedLarge };
struct Rope {
  int B, T, Hq, Hk, hd, head_pad;
  RopePositions pos;
  bool in_place;
  bool large = false;
  unsigned seed(int index, unsigned salt) const {
    return 1000003u * unsigned(B) + 7919u * unsigned(T) + 131u * unsigned(hd) + 17u * unsigned(index) + salt;
  }
};
inline const Rope kRope[] = {
    {3, 7, 4, 2, 8, 0, RopePositions::kPacked, false},      // odd B*T = 21 rows
    {3, 7, 4, 2, 8, 2, RopePositions::kNull, true},         // padded heads, in place
    {2, 5, 3, 1, 64, 0, RopePositions::kPacked, true},
    {1, 9, 2, 2, 128, 0, RopePositions::kPackedLarge, false},
    {2, 3, 5, 5, 128, 4, RopePositions::kPacked, false},    // 5 * 64 pairs: not a multiple of the block
    {1, 1, 1, 0, 2, 0, RopePositions::kNull, false},        // q only, the smallest head
    {2, 11, 6, 2, 10, 0, RopePositions::kPackedLarge, true},
    {1, 64, 32, 32, 128, 0, RopePositions::kPacked, true, true},  // Llama-2-7b heads
};
// A case's positions, drawn after its inputs (empty for kNull).
inline std::vector<int32_t> rope_positions(const Rope& c, std::mt19937& rng) {
  std::vector<int32_t> pos;
  if (c.pos == RopePositions::kNull) return pos;
  pos.resize(size_t(c.B) * size_t(c.T));
  std::uniform_int_distribution<int> len(1, 5), big(3000, 9000);
  for (int b = 0; b < c.B; ++b) {
    const int offset = c.pos == RopePositions::kPackedLarge ? big(rng) : 0;
    for (int t = 0; t < c.T;) {
      const int n = len(rng);  // example length: restarts land mid-row
      for (int k = 0; k < n && t < c.T; ++k, ++t) pos[size_t(b) * size_t(c.T) + size_t(t)] = offset + k;
    }
  }
  return pos;
}

// Attention over B rows of T tokens: H query and KVH key/value heads (GQA groups of H / KVH) of hd
// elements. seg: one example per row, packed examples (seg_start), or packed plus values the op
// clamps. fused: q, k, v are views of one (B*T, H + 2 KVH, hd) buffer as the qkv projection writes
// them (and dq, dk, dv of another). head_pad: elements between the heads of separate tensors (a
// multiple of 8: the kernels need 16-byte aligned heads). qk_std: larger gives peakier softmax
// rows. Tiles in attention.cu: 32 (hd 16, 32), 64/32 (hd 64, 128); T values are not multiples of
// them; packed rows put an example start at t = 13 (mid-tile) and more at random places.
enum class AttentionSeg { kNone, kPacked, kOdd };
struct Attention {
  int B, T, H, KVH, hd;
  AttentionSeg seg;
  bool fused;
  int head_pad;
  float qk_std;
  bool large = false;
  unsigned seed(unsigned salt) const {
    return 1000003u * unsigned(T) + 7919u * unsigned(H) + 131u * unsigned(KVH) + 17u * unsigned(hd) +
           3u * unsigned(seg) + 101u * unsigned(B) + salt;
  }
};
inline const Attention kAttention[] = {
    {2, 37, 2, 2, 16, AttentionSeg::kNone, false, 0, 1.f},     // group 1
    {1, 70, 4, 2, 32, AttentionSeg::kPacked, false, 8, 1.f},   // group 2, three query tiles
    {2, 50, 4, 1, 16, AttentionSeg::kOdd, false, 0, 2.f},      // group 4; rows 32..49 (a whole tile) empty
    {1, 100, 2, 1, 64, AttentionSeg::kPacked, false, 8, 1.f},  // group 2
    {2, 65, 2, 2, 64, AttentionSeg::kNone, true, 0, 1.5f},     // fused qkv, T = tile + 1
    {1, 77, 4, 1, 128, AttentionSeg::kPacked, true, 0, 1.f},   // group 4, fused
    {1, 45, 2, 2, 128, AttentionSeg::kOdd, false, 8, 3.f},     // large scores, odd seg_start values
    {3, 20, 4, 2, 32, AttentionSeg::kPacked, true, 0, 1.f},    // B = 3, one tile
    {1, 1, 2, 1, 32, AttentionSeg::kNone, false, 0, 1.f},      // T = 1
    {2, 200, 4, 2, 16, AttentionSeg::kPacked, false, 0, 1.5f}, // many tiles and examples per row
    {1, 160, 2, 1, 128, AttentionSeg::kPacked, true, 0, 1.f},  // five key tiles per late query tile
    {1, 130, 4, 4, 64, AttentionSeg::kOdd, false, 8, 2.f},     // group 1, half a query tile of empty rows
    {1, 333, 4, 4, 128, AttentionSeg::kNone, false, 0, 1.f, true},  // Llama-2-7b head_dim, many tiles
};
// seg_start per (b, t), drawn first. kPacked: examples start at 0, 13 and random later places
// (lengths 5..T/2). kOdd: packed, plus values the CPU op clamps: rows 32..63 empty (seg_start > t),
// a few more empty rows, and a few negative ones (clamped to 0). Empty for kNone.
inline std::vector<int32_t> attention_seg(const Attention& s, std::mt19937& rng) {
  if (s.seg == AttentionSeg::kNone) return {};
  std::vector<int32_t> seg(size_t(s.B) * size_t(s.T));
  std::uniform_int_distribution<int> len(5, s.T / 2 > 5 ? s.T / 2 : 5);
  for (int b = 0; b < s.B; ++b) {
    int32_t* row = seg.data() + size_t(b) * size_t(s.T);
    for (int t = 0, start = 0, next = s.T > 13 ? 13 : s.T; t < s.T; ++t) {
      if (t == next) start = t, next = t + len(rng);
      row[t] = start;
    }
    if (s.seg != AttentionSeg::kOdd) continue;
    std::uniform_int_distribution<int> pick(0, s.T - 1);
    for (int t = 32; t < 64 && t < s.T; ++t) row[t] = t + 1 + (t % 3);
    for (int n = 0; n < 3; ++n) {
      const int t = pick(rng);
      row[t] = t + 2;
    }
    for (int n = 0; n < 3; ++n) row[pick(rng)] = -7;
  }
  return seg;
}

// One query per head against n cached positions: H query heads, KVH cache heads (GQA groups of
// H / KVH), head dim hd. One position (a block's threads mostly idle); fewer positions than
// threads; more (the strided loop); groups of 1, 2, 4 and 8; odd head dims; a Llama-2-7b layer at
// 4096 positions.
struct Decode {
  int n, H, KVH, hd;
  bool large = false;
  unsigned seed() const {
    return 1000003u * unsigned(n) + 7919u * unsigned(H) + 131u * unsigned(KVH) + 17u * unsigned(hd);
  }
};
inline const Decode kDecode[] = {{1, 2, 1, 16},  {5, 4, 2, 32},      {200, 4, 1, 24},  {130, 8, 8, 64},
                                 {33, 4, 4, 7},  {1, 4, 2, 16},      {37, 8, 8, 64},   {300, 16, 2, 128},
                                 {4096, 32, 32, 128, true}};

// The optimizer's and the element-wise kernels over n elements: sizes around the block (256) and
// the grid-stride loop (1100001 > 4096 blocks x 256 threads); a 3M- and a 30M-element one
// (a 7B layer's gradient shard) on the device.
struct Elements {
  size_t n;
  bool large = false;
};
inline const Elements kAdamw[] = {{1}, {1000}, {4099}, {100003}, {3000017, true}};
inline unsigned adamw_seed(size_t n, bool decay) { return 7001u * unsigned(n) + (decay ? 17u : 3u); }
inline const Elements kSumSquares[] = {{0}, {1}, {1000}, {4099}, {100003}, {3000001}, {30000001, true}};
inline unsigned sum_squares_seed(size_t n) { return 9001u + unsigned(n); }
inline const Elements kScale[] = {{1}, {1000}, {4099}, {100003}, {1100001}};
inline unsigned scale_seed(size_t n) { return 501u + unsigned(n); }
inline const Elements kCast[] = {{1}, {1000}, {4099}, {100003}};
inline unsigned cast_seed(size_t n) { return 77u + unsigned(n); }

// LoRA's dropout over n elements (normal(0, 1) inputs) with drop probability p: sizes around the
// block and the grid-stride loop. The dropped share is checked where n gives it meaning: within 5
// standard deviations of p (the hash's draws are uniform).
struct Dropout {
  size_t n;
  float p;
  unsigned seed() const { return 911u + unsigned(n) + unsigned(p * 1000.f); }
  uint64_t stream() const { return 0x1234567ull * n + 3; }
};
inline const Dropout kDropout[] = {{1, 0.25f},    {255, 0.25f},     {1000, 0.25f},   {4099, 0.05f},
                                   {4099, 0.5f},  {70001, 0.25f},   {100003, 0.05f}, {100003, 0.5f}};
inline bool dropout_share_checked(size_t n) { return n >= 1000; }
inline double dropout_share_tolerance(const Dropout& c) {
  return 5.0 * std::sqrt(double(c.p) * (1.0 - double(c.p)) / double(c.n));
}

}  // namespace lt::kernelcases
