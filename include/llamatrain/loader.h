// Deterministic global data order and micro-batch assembly from a TokenSplit.
// The order maps (epoch, global index) to a row independently of how the rows of a step are
// split over ranks and micro-batches, so any split trains on the same samples.
#pragma once
#include <cstdint>
#include <vector>

#include "llamatrain/batch.h"
#include "llamatrain/dataset.h"

namespace lt {

class DataOrder {
 public:
  DataOrder(int64_t n_rows, uint64_t seed, bool shuffle = true);
  // Row index of global sample i of epoch e (0 <= i < n_rows); a fresh permutation per epoch.
  int64_t row(int64_t epoch, int64_t i);
  int64_t n_rows() const { return n_rows_; }

 private:
  int64_t n_rows_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

// Owns the (B,T) arrays of one micro-batch and exposes them as a Batch.
struct MicroBatch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<uint8_t> mask;
  std::vector<int32_t> pos, seg_start;  // packed splits only: RoPE positions, first visible key
  int64_t loss_tokens = 0;
  // Rows of `split` (tokens (seq_len+1) each): inputs = row[0..T), targets = row[1..T], the
  // mask of the target positions.
  void fill(const TokenSplit& split, const std::vector<int64_t>& rows);
  Batch batch() const;
};

}  // namespace lt
