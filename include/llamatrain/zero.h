// ZeRO-style data parallelism over the flat parameter buffer (DESIGN.md "Distributed training").
//
// The flat vector of N parameters is padded to P = ceil(N / W) * W and cut into W equal contiguous
// shards of S = P / W; rank r owns [r S, (r+1) S) (the padding, at the end of the last shard, is
// zero and never updated).
//  stage 0: gradients are all-reduced, every rank keeps Adam m, v for all N and updates all of it;
//  stage 1: gradients are all-reduced, each rank keeps m, v for its shard only, updates its shard
//           and the shards are all-gathered;
//  stage 2: gradients are reduce-scattered, so each rank receives only its shard of the summed
//           gradient (half the traffic of an all-reduce), then as stage 1.
// The clipping norm is the global one: each rank's sum of squares over its shard, all-reduced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/model.h"
#include "llamatrain/optim.h"

namespace lt {

struct ShardLayout {
  size_t n = 0;       // parameters
  int world = 1;
  size_t padded = 0;  // multiple of world
  size_t shard = 0;   // padded / world
  ShardLayout(size_t n_params, int world_size);
  // This rank's real elements: [begin(r), end(r)) within [0, n).
  size_t begin(int r) const;
  size_t end(int r) const;
};

// Bytes per rank of what training holds, from the sizes alone (the CPU backend keeps fp32
// everywhere): the working parameters, the gradient buffer, Adam m and v, activations.
struct MemoryRow {
  int rank = 0;
  double params = 0, grads = 0, optimizer = 0, activations = 0;
  double total() const { return params + grads + optimizer + activations; }
};
std::vector<MemoryRow> memory_table(size_t n_params, int world, int zero_stage, double activation_bytes_per_rank);
std::string format_memory_table(const std::vector<MemoryRow>& rows, int zero_stage);

class ZeroOptimizer {
 public:
  ZeroOptimizer(Comm& comm, const ParameterLayout& layout, int stage, AdamWConfig cfg);
  int stage() const { return stage_; }
  Comm& comm() const { return comm_; }
  const ShardLayout& shards() const { return shards_; }
  // Parameter and gradient buffers must hold this many floats (zeros past layout.total()).
  size_t padded_size() const { return shards_.padded; }
  // Sums the ranks' gradients: all of grads for stages 0 and 1, this rank's shard for stage 2.
  void reduce_gradients(float* grads);
  // The global L2 norm of the summed gradient, before clipping; scales the part this rank uses so
  // that the norm is at most max_norm (no clipping when max_norm <= 0).
  double clip_gradients(float* grads, float max_norm);
  // AdamW on the part this rank owns, then (stages 1, 2) every rank gets every shard.
  void step(float* params, const float* grads, float lr, int64_t t);
  // Bytes of optimizer state held by this rank.
  size_t optimizer_bytes() const;
  // The Adam state this rank holds: m, v over [own_begin, own_end) of the flat buffer (all of it
  // for stage 0, this rank's shard otherwise).
  AdamW& adamw() { return adamw_; }
  size_t own_begin() const { return own_begin_; }
  size_t own_end() const { return own_end_; }

 private:
  Comm& comm_;
  int stage_;
  ShardLayout shards_;
  size_t own_begin_, own_end_;  // what this rank updates
  AdamW adamw_;
};

}  // namespace lt
