// AdamW over (a shard of) the flat parameter buffer, and the learning-rate schedule.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llamatrain/model.h"

namespace lt {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; applied to matrices and embeddings, not norm weights
};

// AdamW state (fp32 m, v) for the flat range [begin, end) of a ParameterLayout. The range may
// cut tensors anywhere (ZeRO shards); weight decay follows each tensor's flag.
class AdamW {
 public:
  AdamW(const ParameterLayout& layout, size_t begin, size_t end, AdamWConfig cfg)
      : AdamW(layout.tensors(), layout.total(), begin, end, cfg) {}
  // The same over any flat table of tensors (LoRA's adapters: LoraLayout::tensors).
  AdamW(const std::vector<TensorInfo>& tensors, size_t total, size_t begin, size_t end, AdamWConfig cfg);
  // One update of params[begin, end) with grads[begin, end) (both indexed in the full buffer),
  // `t` the 1-based step for bias correction.
  void step(float* params, const float* grads, float lr, int64_t t) {
    step_slice(params + begin_, grads + begin_, lr, t);
  }
  // The same with pointers to element begin of the parameters and gradients (shards held alone).
  void step_slice(float* params, const float* grads, float lr, int64_t t) {
    step_window(params, grads, begin_, end_, lr, t);
  }
  // The update of the flat elements [lo, hi), a part of [begin, end), with pointers to element lo
  // (a bf16 gradient shard is converted and stepped a window at a time).
  void step_window(float* params, const float* grads, size_t lo, size_t hi, float lr, int64_t t);
  // Write access to the moments: from then on they are no longer known to be zero.
  std::vector<float>& m() { return moments_zero_ = false, m_; }
  std::vector<float>& v() { return moments_zero_ = false, v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  // True while m and v are as constructed, all zero (no write access and no update yet): a fresh
  // run. A device's optimizer then sets its moments with a memset on the device instead of
  // copying host zeros (a 7B model's are 54 GB); a resume has written them.
  bool moments_zero() const { return moments_zero_; }
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  const AdamWConfig& config() const { return cfg_; }
  // The tensor pieces inside [begin, end), each with its weight-decay flag (the device optimizer
  // updates the same pieces).
  struct Range {
    size_t begin, end;
    bool decay;
  };
  const std::vector<Range>& ranges() const { return ranges_; }

 private:
  std::vector<Range> ranges_;
  size_t begin_, end_;
  AdamWConfig cfg_;
  std::vector<float> m_, v_;
  bool moments_zero_ = true;
};

// Linear warm-up from 0 to max_lr over warmup_steps, then cosine decay to min_lr at total_steps.
struct LrSchedule {
  float max_lr = 3e-4f;
  float min_lr = 3e-5f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float at(int64_t step) const;  // step is 0-based
};

// Scales grads so that their global L2 norm is at most max_norm (no-op when max_norm <= 0).
// Returns the norm before clipping.
double clip_grad_norm(float* grads, size_t n, float max_norm);

}  // namespace lt
