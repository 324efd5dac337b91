// Each kernel's cases written once (issue 34, point 7, as ggml's test-backend-ops): the shapes and
// the seeds that the simulator's tests (tests/sim/test_*_sim.cpp) and the device program's checks
// (tests/gpu/kernel_checks.cu, run on a GPU by scripts/gpu-check.sh and in CI on the simulator by
// GpuCheck.rehearsal) both run, so a first GPU run checks exactly the cases CI checks. Both judge
// them by the same rules (sim_test_util.h: the worst element against fp64 within 2x the naive bf16
// computation's, finite values, untouched padding). `large` cases (Llama-2-7b-sized rows, heads and
// vocabularies) run in the device program only: on the simulator in the rehearsal, not again in
// each of the simulator tests' orders and sanitizer builds.
// Not in the table yet: attention (tests/sim/attention_test_util.h has its own list), RoPE, LoRA's
// dropout and the tensor-core fragments.
#pragma once
#include <cstddef>

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

}  // namespace lt::kernelcases
