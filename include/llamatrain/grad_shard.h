// A rank's shard of the summed gradient under ZeRO 2 and 3 on the CPU (zero.h), in fp32 or, with
// --grad-reduce-dtype bf16, in bf16: half the bytes, which is what lets the 16-byte-per-parameter
// budget of the ZeRO paper (2 bf16 weights + 2 bf16 gradients + 12 fp32 master and Adam) hold.
//
// Every micro-batch round adds its reduced gradients to the shard. A bf16 sum rounded to nearest
// loses an addend smaller than half a unit in the last place of the running sum (bf16 keeps 8
// significant bits): with tens of micro-batches per step each addend is near that size, so the sum
// would be biased towards its first terms. The bf16 shard therefore rounds each sum stochastically
// (up with the probability of the remainder, from a hash of the element and the add), which keeps
// the expected value of the sum exact; fp32 adds as usual.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llamatrain/comm.h"

namespace lt {

class GradShard {
 public:
  // n zeros of dtype kF32 or kBF16.
  void assign(size_t n, DType dtype);
  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * dtype_size(dtype_); }
  void zero();
  // this[at + i] += x[i] for i < n (x in fp32, or in bf16 as a bf16 reduction delivers it).
  void add(size_t at, const float* x, size_t n);
  void add_bf16(size_t at, const uint16_t* x, size_t n);
  // Sum of squares of [at, at + n), in double.
  double sum_squares(size_t at, size_t n) const;
  void scale(float s);
  // fp32 values of [at, at + n) into out.
  void read(size_t at, size_t n, float* out) const;
  std::vector<float> to_f32() const;
  // Calls f(at, g, n) over consecutive windows of at most `window` elements, g their fp32 values
  // (the storage itself for fp32, a converted copy for bf16).
  template <class F>
  void for_windows(size_t window, F&& f) const {
    if (dtype_ == DType::kF32) return f(size_t(0), f32_.data(), n_);
    std::vector<float> buf(std::min(window, n_));
    for (size_t at = 0; at < n_; at += window) {
      const size_t n = std::min(window, n_ - at);
      read(at, n, buf.data());
      f(at, static_cast<const float*>(buf.data()), n);
    }
  }

 private:
  float round_add(size_t i, float sum) const;
  DType dtype_ = DType::kF32;
  size_t n_ = 0;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
  uint64_t adds_ = 0;  // calls to add: with the element index, the stochastic rounding's seed
};

// bf16 <-> fp32 (round to nearest, ties to even), and the stochastic rounding of GradShard:
// x rounded down or up to a bf16 neighbour with probability given by the 16 dropped bits against
// `random` (uniform over [0, 2^16)). Non-finite values round to nearest.
uint16_t bf16_round_stochastic(float x, uint32_t random16);

}  // namespace lt
