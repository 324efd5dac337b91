#include "llamatrain/loader.h"

#include <numeric>

#include "llamatrain/error.h"
#include "llamatrain/rng.h"

namespace lt {

DataOrder::DataOrder(int64_t n_rows, uint64_t seed, bool shuffle)
    : n_rows_(n_rows), seed_(seed), shuffle_(shuffle) {}

int64_t DataOrder::row(int64_t epoch, int64_t i) {
  LT_CHECK(i >= 0 && i < n_rows_, "sample index ", i, " outside [0, ", n_rows_, ")");
  if (!shuffle_) return i;
  if (epoch != cached_epoch_) {
    perm_.resize(size_t(n_rows_));
    std::iota(perm_.begin(), perm_.end(), int64_t(0));
    // One independent stream per epoch: the seed mixed with the epoch number.
    Rng rng(seed_ ^ (0xD1B54A32D192ED03ull * uint64_t(epoch + 1)));
    shuffle(perm_, rng);
    cached_epoch_ = epoch;
  }
  return perm_[size_t(i)];
}

void MicroBatch::fill(const TokenSplit& split, const std::vector<int64_t>& rows) {
  B = int(rows.size());
  T = split.seq_len;
  const size_t n = size_t(B) * T;
  inputs.resize(n);
  targets.resize(n);
  mask.resize(n);
  pos.resize(split.packed() ? n : 0);
  seg_start.resize(split.packed() ? n : 0);
  loss_tokens = 0;
  for (int b = 0; b < B; ++b) {
    const int32_t* tok = split.row_tokens(rows[size_t(b)]);
    const uint8_t* m = split.row_mask(rows[size_t(b)]);
    for (int t = 0; t < T; ++t) {
      const size_t i = size_t(b) * T + t;
      inputs[i] = tok[t];
      targets[i] = tok[t + 1];
      mask[i] = m[t + 1];
      loss_tokens += m[t + 1];
      if (split.packed()) {
        pos[i] = split.row_positions(rows[size_t(b)])[t];
        seg_start[i] = t - pos[i];
      }
    }
  }
}

Batch MicroBatch::batch() const {
  Batch b;
  b.B = B;
  b.T = T;
  b.inputs = inputs.data();
  b.targets = targets.data();
  b.loss_mask = mask.data();
  if (!pos.empty()) {
    b.pos = pos.data();
    b.seg_start = seg_start.data();
  }
  return b;
}

}  // namespace lt
